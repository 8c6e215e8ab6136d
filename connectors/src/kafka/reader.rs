//! The pull engine of one Kafka source instance: its consumer over the
//! partitions it owns, where each stands, a pull up to the partitions'
//! ends (or exactly to a replay's targets) within the pull's budget, and
//! the undecodable records it sends to the dead-letter topic.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::record_batch::RecordBatch;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::BaseProducer;
use rdkafka::{Offset, TopicPartitionList};
use skein_clients::kafka::KafkaRole;
use skein_engine::payload::SourceOffset;
use skein_engine::source::{EpochSpec, MicroBatch, PartitionProgress};
use tracing::{debug, warn};

use super::config::{KafkaSourceConfig, Startup};
use super::consumer::{BatchConsumer, Fetched};
use super::dead_letters::{DeadLetter, publish_letters};
use crate::error::{ConnectorError, Result};
use skein_formats::decode::{BatchBuilder, RecordDecoder};

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// Planning asks for the partitions with a shorter wait: a broker that is
/// not there yet costs `skein explain` this, and the table one instance.
const SIZING_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a pull waits for an unreachable broker before it fails.
const BROKER_WAIT: Duration = Duration::from_secs(120);

/// The consumer of one source instance and where it stands.
pub(super) struct PartitionReader {
    consumer: BatchConsumer,
    /// Next offset to read, per owned partition.
    positions: Mutex<BTreeMap<i32, i64>>,
    /// Whether the partitions have been assigned (at the first pull, from
    /// `positions`). The consumer is assigned once in its life and moved
    /// by seeking after that: librdkafka 2.12 aborts the process when a
    /// second assignment replaces one whose fetchers are still stopping
    /// (confluentinc/librdkafka#5573), which a restart that assigned at
    /// open, again at the checkpoint's offsets and again after a replay
    /// could do.
    assigned: AtomicBool,
    /// Each owned partition's end offset when the reader was opened: what
    /// `--until-drained` reads up to.
    ends_at_open: BTreeMap<i32, i64>,
    /// Polled by `flush` when dead letters are sent (no thread of its own).
    dead_letter_producer: Option<BaseProducer>,
    /// Per owned partition: the cached high watermark last seen, and when
    /// it last moved (or the broker last confirmed it).
    watermarks_seen: Mutex<BTreeMap<i32, (i64, Instant)>>,
}

/// How long a cached high watermark that has not moved is trusted before
/// the broker is asked: a partition whose fetches stopped coming back (a
/// broker gone away) then finds out within this time.
const CACHED_WATERMARK_TRUST: Duration = Duration::from_secs(1);

/// An undecodable record, kept until it is sent to the dead-letter topic.
struct Undecodable {
    partition: i32,
    offset: i64,
    reason: String,
    payload: Vec<u8>,
}

/// What one pull has read so far, per owned partition.
struct PullState<'a> {
    topic: &'a str,
    /// A replay reads exactly up to its targets, and no further.
    replay: bool,
    /// Whether the decoder rejects records only when it builds the batch
    /// (then `pushed` keeps their offsets).
    late: bool,
    /// (partition, next offset, target) per owned partition.
    parts: Vec<(i32, i64, i64)>,
    /// Partitions still short of their target.
    lagging: usize,
    /// Per owned partition: whether a replay took records past its target
    /// from the queue (and so must fetch them again).
    overread: Vec<bool>,
    builders: Vec<BatchBuilder<'a>>,
    pushed: Vec<Vec<i64>>,
    undecodable: Vec<Undecodable>,
    records: usize,
    bytes: usize,
}

impl PullState<'_> {
    /// Takes one item of a consumer queue.
    fn take(&mut self, fetched: Fetched<'_>) {
        let (partition, offset, payload) = match fetched {
            Fetched::Error(e) => {
                warn!(topic = %self.topic, "kafka consumer: {e}");
                return;
            }
            Fetched::Record {
                partition,
                offset,
                payload,
            } => (partition, offset, payload),
        };
        let Some(i) = self.parts.iter().position(|(p, _, _)| *p == partition) else {
            return;
        };
        let part = &mut self.parts[i];
        if offset < part.1 {
            return; // already read (a refetch after a reconnect)
        }
        if self.replay && offset >= part.2 {
            self.overread[i] = true;
            return; // past what the replayed pull read
        }
        let was_behind = part.1 < part.2;
        part.1 = offset + 1;
        if was_behind && part.1 >= part.2 {
            self.lagging -= 1;
        }
        self.records += 1;
        self.bytes += payload.len();
        if self.late {
            self.pushed[i].push(offset);
        }
        if let Some(reason) = self.builders[i].push(payload) {
            self.undecodable.push(Undecodable {
                partition,
                offset,
                reason: reason.to_string(),
                payload: payload.to_vec(),
            });
        }
    }
}

/// How many partitions the topic has (a table's default parallelism).
pub(super) fn partition_count(config: &KafkaSourceConfig) -> Result<usize> {
    let consumer: BaseConsumer = config.client_config(KafkaRole::Consumer).create()?;
    Ok(topic_partitions(&consumer, &config.topic, SIZING_TIMEOUT)?.len())
}

/// The topic's partitions, sorted; a topic the broker does not know (or
/// reports an error for) is an error.
fn topic_partitions(consumer: &BaseConsumer, topic: &str, wait: Duration) -> Result<Vec<i32>> {
    let metadata = consumer.fetch_metadata(Some(topic), wait)?;
    let found = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| ConnectorError::Other(format!("topic {topic} not found")))?;
    if let Some(e) = found.error() {
        return Err(ConnectorError::Other(format!("topic {topic}: {e:?}")));
    }
    let mut all: Vec<i32> = found.partitions().iter().map(|p| p.id()).collect();
    all.sort_unstable();
    Ok(all)
}

/// The high watermark of every partition of the topic.
pub(super) fn latest_offsets(config: &KafkaSourceConfig) -> Result<Vec<SourceOffset>> {
    let consumer: BaseConsumer = config.client_config(KafkaRole::Consumer).create()?;
    let metadata = consumer.fetch_metadata(Some(&config.topic), METADATA_TIMEOUT)?;
    let mut out = vec![];
    for topic in metadata
        .topics()
        .iter()
        .filter(|t| t.name() == config.topic)
    {
        for p in topic.partitions() {
            let (_, high) = consumer.fetch_watermarks(&config.topic, p.id(), METADATA_TIMEOUT)?;
            out.push(SourceOffset {
                source: config.topic.clone(),
                partition: p.id(),
                offset: high,
                position: None,
            });
        }
    }
    out.sort_by_key(|o| o.partition);
    Ok(out)
}

impl PartitionReader {
    pub(super) fn open(config: &KafkaSourceConfig, spec: EpochSpec) -> Result<Self> {
        // Larger fetches than librdkafka's defaults (FETCH_DEFAULTS): a
        // pull drains a backlog.
        let mut client = config.client_config(KafkaRole::Consumer);
        client.set("enable.auto.commit", "false");
        client.set("enable.auto.offset.store", "false");
        if !config.client.contains_key("group.id") {
            client.set("group.id", format!("skein-{}", config.topic));
        }
        let consumer: BaseConsumer = client.create()?;
        let all = topic_partitions(&consumer, &config.topic, METADATA_TIMEOUT)?;
        let instances = spec.instances.max(1);
        let owned: Vec<i32> = all
            .iter()
            .enumerate()
            .filter(|(i, _)| i % instances == spec.instance)
            .map(|(_, p)| *p)
            .collect();
        let committed = if config.startup == Startup::Committed {
            let mut tpl = TopicPartitionList::new();
            for p in &owned {
                tpl.add_partition(&config.topic, *p);
            }
            Some(consumer.committed_offsets(tpl, METADATA_TIMEOUT)?)
        } else {
            None
        };
        // The first offset at or after the time, per partition (-1 or no
        // answer: none, so the partition's end).
        let at_time = if let Startup::AtTimestamp(ms) = config.startup {
            let mut tpl = TopicPartitionList::new();
            for p in &owned {
                tpl.add_partition_offset(&config.topic, *p, Offset::Offset(ms))?;
            }
            Some(consumer.offsets_for_times(tpl, METADATA_TIMEOUT)?)
        } else {
            None
        };
        if config.startup == Startup::Checkpoint {
            return Err(ConnectorError::Config(format!(
                "topic {}: 'startup' 'checkpoint' was not resolved to the offsets the sink \
                 committed; run the query with `skein run`, which reads them",
                config.topic
            )));
        }
        let mut positions = BTreeMap::new();
        let mut ends_at_open = BTreeMap::new();
        for &p in &owned {
            let (low, high) = consumer.fetch_watermarks(&config.topic, p, METADATA_TIMEOUT)?;
            ends_at_open.insert(p, high);
            let start = match &config.startup {
                Startup::Earliest => low,
                Startup::Latest => high,
                Startup::Offsets(map) => map.get(&p).copied().unwrap_or(low),
                Startup::AtTimestamp(_) => at_time
                    .as_ref()
                    .and_then(|t| t.find_partition(&config.topic, p))
                    .and_then(|e| match e.offset() {
                        Offset::Offset(n) if n >= 0 => Some(n),
                        _ => None,
                    })
                    .unwrap_or(high),
                // Refused above, before any partition is assigned.
                Startup::Checkpoint => low,
                Startup::Committed => committed
                    .as_ref()
                    .and_then(|c| c.find_partition(&config.topic, p))
                    .and_then(|e| match e.offset() {
                        Offset::Offset(n) => Some(n),
                        _ => None,
                    })
                    .unwrap_or(low),
            };
            positions.insert(p, start);
        }
        // Each partition gets a queue of its own before it is assigned, so
        // that a pull takes a share of every one (see `pull`).
        let consumer = BatchConsumer::with_partition_queues(consumer, &config.topic, &owned)
            .map_err(ConnectorError::Other)?;
        debug!(topic = %config.topic, instance = spec.instance, ?positions, "kafka source opened");
        let dead_letter_producer = match &config.dead_letter_topic {
            Some(_) => Some(config.client_config(KafkaRole::Producer).create()?),
            None => None,
        };
        Ok(PartitionReader {
            consumer,
            positions: Mutex::new(positions),
            assigned: AtomicBool::new(false),
            ends_at_open,
            dead_letter_producer,
            watermarks_seen: Mutex::new(BTreeMap::new()),
        })
    }

    /// Where the reader stands, as source offsets.
    pub(super) fn offsets(&self, topic: &str) -> Vec<SourceOffset> {
        self.positions
            .lock()
            .expect("positions")
            .iter()
            .map(|(p, o)| SourceOffset {
                source: topic.to_string(),
                partition: *p,
                offset: *o,
                position: None,
            })
            .collect()
    }

    /// Stand at `at` for the partitions it names (a restart from the
    /// offsets log); the others stay where they are.
    pub(super) fn seek(&self, topic: &str, at: &BTreeMap<i32, i64>) -> Result<()> {
        let mut positions = self.positions.lock().expect("positions");
        let mut moved = vec![];
        for (p, pos) in positions.iter_mut() {
            if let Some(&o) = at.get(p)
                && *pos != o
            {
                *pos = o;
                moved.push(*p);
            }
        }
        if moved.is_empty() {
            return Ok(());
        }
        // Not yet assigned: the first pull assigns at the new positions.
        if self.assigned.load(Ordering::Acquire) {
            self.move_fetchers(topic, &positions, &moved)?;
        }
        debug!(%topic, ?positions, "kafka source moved to the checkpoint's offsets");
        Ok(())
    }

    /// Assigns the owned partitions at `positions`, once.
    fn assign_once(&self, topic: &str, positions: &BTreeMap<i32, i64>) -> Result<()> {
        if self.assigned.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut assignment = TopicPartitionList::new();
        for (p, pos) in positions {
            assignment.add_partition_offset(topic, *p, Offset::Offset(*pos))?;
        }
        self.consumer.consumer().assign(&assignment)?;
        self.assigned.store(true, Ordering::Release);
        debug!(%topic, ?positions, "kafka source assigned");
        Ok(())
    }

    /// Points the fetchers of the `moved` partitions (assigned already) at
    /// their positions; what librdkafka had queued for them is dropped.
    fn move_fetchers(
        &self,
        topic: &str,
        positions: &BTreeMap<i32, i64>,
        moved: &[i32],
    ) -> Result<()> {
        for p in moved {
            let at = Offset::Offset(positions[p]);
            self.consumer
                .consumer()
                .seek(topic, *p, at, METADATA_TIMEOUT)
                .map_err(|e| {
                    ConnectorError::Other(format!(
                        "topic {topic}: moving partition {p} to offset {}: {e}",
                        positions[p]
                    ))
                })?;
        }
        Ok(())
    }

    pub(super) fn pull(
        &self,
        config: &KafkaSourceConfig,
        decoder: &RecordDecoder,
        targets: Option<&BTreeMap<i32, i64>>,
    ) -> Result<MicroBatch> {
        let mut positions = self.positions.lock().expect("positions");
        self.assign_once(&config.topic, &positions)?;
        let consumer = self.consumer.consumer();
        // Read up to where each partition ended when the pull began, so that
        // a pull ends even while producers keep writing.
        // While the broker is away, wait for it (up to BROKER_WAIT): an
        // empty pull would otherwise look like a drained topic.
        // The high watermark of the last fetch response is used when it
        // shows records to read, or has moved within the last
        // CACHED_WATERMARK_TRUST: it never exceeds the true end, and a fetch
        // the broker holds at the end of a partition returns as soon as a
        // record is appended, so on a live partition it is at most a round
        // trip old. Otherwise the broker is asked, which is slow: the
        // request waits behind any fetch the broker is holding for
        // `fetch.wait.max.ms` (asked on every pull, that wait set an epoch's
        // length at the end of a live topic, and so YSB's window latency).
        // Per owned partition: (partition, next offset, target).
        let started = Instant::now();
        let mut parts: Vec<(i32, i64, i64)> = Vec::with_capacity(positions.len());
        let waiting_since = Instant::now();
        let mut seen = self.watermarks_seen.lock().expect("watermarks seen");
        for (&p, &pos) in positions.iter() {
            if let Some(targets) = targets {
                // A replay reads exactly what the logged pull read.
                parts.push((p, pos, targets.get(&p).copied().unwrap_or(pos)));
                continue;
            }
            if let Some((_, high)) = self.consumer.cached_watermarks(&config.topic, p) {
                let now = Instant::now();
                // Trusted while it moves, and a second after it last did.
                let trusted = match seen.get(&p) {
                    Some(&(last, since)) if last == high => {
                        now.duration_since(since) < CACHED_WATERMARK_TRUST
                    }
                    _ => {
                        seen.insert(p, (high, now));
                        true
                    }
                };
                if high > pos || trusted {
                    parts.push((p, pos, high.max(pos)));
                    continue;
                }
            }
            loop {
                match consumer.fetch_watermarks(&config.topic, p, METADATA_TIMEOUT) {
                    Ok((_, high)) => {
                        seen.insert(p, (high, Instant::now()));
                        parts.push((p, pos, high));
                        break;
                    }
                    Err(e) if waiting_since.elapsed() < BROKER_WAIT => {
                        warn!(topic = %config.topic, partition = p, "high watermark unknown, retrying: {e}");
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        drop(seen);
        let lagging = parts.iter().filter(|(_, pos, high)| pos < high).count();
        // One builder per partition, so event time is tracked per partition.
        let builders: Vec<_> = parts
            .iter()
            .map(|(_, pos, high)| {
                decoder.builder(((high - pos).max(0) as usize).min(config.max_records_per_pull))
            })
            .collect();
        let targets_known = started.elapsed();
        let mut read = PullState {
            topic: &config.topic,
            replay: targets.is_some(),
            late: decoder.rejects_late(),
            pushed: vec![vec![]; parts.len()],
            overread: vec![false; parts.len()],
            parts,
            lagging,
            builders,
            undecodable: Vec::new(),
            records: 0,
            bytes: 0,
        };
        // A replay has no budget: it must read all it read before.
        let (max_records, max_bytes, deadline) = match targets {
            Some(_) => (usize::MAX, usize::MAX, Instant::now() + BROKER_WAIT),
            None => (
                config.max_records_per_pull,
                config.max_bytes_per_pull,
                Instant::now() + config.pull_timeout,
            ),
        };
        // Records are decoded straight from librdkafka's buffers, a batch at
        // a time; the byte budget is checked between batches. Each lagging
        // partition takes an equal share of what is left of the budget from
        // its own queue, so a small budget still moves every partition (and
        // so event time, which closes windows at the slowest partition).
        let mut rounds = 0usize;
        while read.lagging > 0 && read.records < max_records && read.bytes < max_bytes {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            // The shared queue holds only errors: every owned partition has
            // a queue of its own (`open`).
            let mut seen = self.consumer.read(Duration::ZERO, 1, |f| read.take(f));
            let behind: Vec<i32> = read
                .parts
                .iter()
                .filter(|(_, pos, target)| pos < target)
                .map(|(p, _, _)| *p)
                .collect();
            let left = (max_records - read.records).min(config.max_records_per_pull);
            let share = (left / behind.len().max(1)).max(1);
            for &p in &behind {
                if read.bytes >= max_bytes {
                    break;
                }
                seen += self
                    .consumer
                    .read_partition(p, Duration::ZERO, share, |f| read.take(f));
            }
            // Nothing queued anywhere: wait a little on one lagging
            // partition (in turn), then look at all of them again.
            if seen == 0
                && let Some(&p) = behind.get(rounds % behind.len().max(1))
            {
                let wait = (deadline - now).min(Duration::from_millis(10));
                seen = self
                    .consumer
                    .read_partition(p, wait, share, |f| read.take(f));
                rounds += 1;
            }
            if seen == 0 {
                read.lagging = self.step_over_markers(config, &mut read.parts);
            }
        }
        let PullState {
            parts,
            builders,
            pushed,
            mut undecodable,
            records,
            bytes,
            overread,
            ..
        } = read;
        for (p, pos, _) in &parts {
            positions.insert(*p, *pos);
        }
        if targets.is_some() {
            if let Some((p, pos, target)) = parts.iter().find(|(_, pos, target)| pos < target) {
                return Err(ConnectorError::Other(format!(
                    "replaying an epoch from the checkpoint: partition {p} of {} gave offsets \
                     up to {pos} only, not {target} (deleted by retention?)",
                    config.topic
                )));
            }
            // Records past the targets were taken from librdkafka's queue
            // and skipped: fetch them again from where the replay ends.
            let overread: Vec<i32> = parts
                .iter()
                .zip(&overread)
                .filter(|(_, skipped)| **skipped)
                .map(|((p, _, _), _)| *p)
                .collect();
            self.move_fetchers(&config.topic, &positions, &overread)?;
        }
        let mut batches: Vec<RecordBatch> = vec![];
        let mut partitions = Vec::with_capacity(parts.len());
        for (((p, pos, high), builder), offsets) in parts.iter().zip(builders).zip(&pushed) {
            let (batch, rejected) = builder.finish()?;
            for r in rejected {
                if let (Some(payload), Some(&offset)) = (r.record, offsets.get(r.index)) {
                    undecodable.push(Undecodable {
                        partition: *p,
                        offset,
                        reason: r.reason,
                        payload,
                    });
                }
            }
            let mut progress = PartitionProgress {
                partition: p.to_string(),
                lag: Some((high - pos).max(0) as u64),
                caught_up: pos >= high,
                drained: self.ends_at_open.get(p).is_none_or(|end| pos >= end),
                ..Default::default()
            };
            if batch.num_rows() > 0 {
                progress.batches.push(batches.len());
                batches.push(batch);
            }
            partitions.push(progress);
        }
        debug!(
            topic = %config.topic,
            records,
            bytes,
            rejected = undecodable.len(),
            watermarks_ms = targets_known.as_millis() as u64,
            pull_ms = started.elapsed().as_millis() as u64,
            "kafka pull"
        );
        if !undecodable.is_empty() {
            skein_engine::metrics::dead_letters(&config.topic, undecodable.len() as u64);
            self.send_dead_letters(config, &undecodable)?;
        }
        let offsets = positions
            .iter()
            .map(|(p, o)| SourceOffset {
                source: config.topic.clone(),
                partition: *p,
                offset: *o,
                position: None,
            })
            .collect();
        Ok(MicroBatch {
            batches,
            offsets,
            partitions,
            dead_letters: undecodable.len() as u64,
            dead_letter_reason: undecodable.last().map(|u| {
                format!(
                    "partition {} offset {}: {}",
                    u.partition, u.offset, u.reason
                )
            }),
            ..Default::default()
        })
    }

    /// A partition written by a transactional producer ends in a commit
    /// marker, a record the consumer never hands out: its position cannot
    /// reach the end offset by reading. librdkafka's position does step
    /// over markers, so a partition that gave nothing takes its position
    /// from there. Returns how many partitions still lag.
    fn step_over_markers(
        &self,
        config: &KafkaSourceConfig,
        parts: &mut [(i32, i64, i64)],
    ) -> usize {
        if let Ok(tpl) = self.consumer.consumer().position() {
            for part in parts.iter_mut().filter(|(_, pos, high)| pos < high) {
                if let Some(Offset::Offset(n)) = tpl
                    .find_partition(&config.topic, part.0)
                    .map(|e| e.offset())
                    && n > part.1
                {
                    part.1 = n.min(part.2);
                }
            }
        }
        parts.iter().filter(|(_, pos, high)| pos < high).count()
    }

    /// Publish the rejected records and wait until the broker has them: the
    /// offsets that pass them must not be committed before.
    fn send_dead_letters(
        &self,
        config: &KafkaSourceConfig,
        rejected: &[Undecodable],
    ) -> Result<()> {
        let (Some(producer), Some(dlt)) = (&self.dead_letter_producer, &config.dead_letter_topic)
        else {
            for r in rejected {
                warn!(topic = %config.topic, partition = r.partition, offset = r.offset, reason = %r.reason, "undecodable record dropped (no dead.letter.topic)");
            }
            return Ok(());
        };
        publish_letters(
            producer,
            dlt,
            rejected.iter().map(|r| {
                let (partition, offset) = (r.partition, r.offset);
                let letter =
                    DeadLetter::new(&config.topic, partition, offset, &r.reason, &r.payload);
                let value = serde_json::to_vec(&letter).expect("dead letter serializes");
                (format!("{}/{partition}/{offset}", config.topic), value)
            }),
        )
    }
}
