//! Reading the compacted topic where exactly-once Kafka writers keep their
//! epoch markers (`<name>/<run>/<member>` -> epoch) and, with a
//! `checkpoint`, source offsets (`<checkpoint>/<source>/<partition>` -> next
//! offset to read).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::epoch_markers::parse_marker_field;
use crate::error::{ConnectorError, Result};

/// Every committed record of `offsets_topic` whose key starts with
/// `prefix`, as key without the prefix -> value (latest wins).
///
/// It reads up to the high watermark seen when it starts, not merely to the
/// last stable offset: a transaction of another writer still open there
/// would otherwise hide this writer's later commits. Records past an open
/// transaction arrive once it ends, so this waits up to `wait` for that.
pub(super) fn read_latest(
    brokers: &str,
    offsets_topic: &str,
    prefix: &str,
    wait: Duration,
) -> Result<BTreeMap<String, String>> {
    let reader = |isolation: &str| -> Result<BaseConsumer> {
        ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", "skein-offsets-reader")
            .set("enable.auto.commit", "false")
            .set("isolation.level", isolation)
            // It reads to a known end: a fetch that finds nothing more must
            // not be held by the broker (500 ms by default) at every open.
            .set("fetch.wait.max.ms", "10")
            .create()
            .map_err(|e| ConnectorError::kafka("offsets reader", e))
    };
    let consumer = reader("read_committed")?;
    // The ends are the log's, not what read_committed sees yet: a
    // read_committed client is told the last stable offset, which an open
    // transaction (another writer's, left by a crash) holds back below
    // records committed after it. Reading only that far missed a marker
    // committed just before a crash, and its epoch was written twice.
    let ends_of = reader("read_uncommitted")?;
    let metadata = ends_of
        .fetch_metadata(Some(offsets_topic), Duration::from_secs(30))
        .map_err(|e| ConnectorError::kafka(format!("metadata of {offsets_topic}"), e))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .first()
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    let mut ends = BTreeMap::new();
    for p in partitions {
        let (low, high) = ends_of
            .fetch_watermarks(offsets_topic, p, Duration::from_secs(30))
            .map_err(|e| ConnectorError::kafka(format!("watermarks of {offsets_topic}/{p}"), e))?;
        if high > low {
            ends.insert(p, high);
        }
    }
    let mut out = BTreeMap::new();
    if ends.is_empty() {
        return Ok(out);
    }
    let mut tpl = TopicPartitionList::new();
    for p in ends.keys() {
        tpl.add_partition_offset(offsets_topic, *p, Offset::Beginning)
            .map_err(|e| ConnectorError::kafka(format!("assigning {offsets_topic}"), e))?;
    }
    // Connected before it is assigned: a client assigned before it knows
    // the partition's leader starts fetching only on its 500 ms retry.
    consumer
        .fetch_metadata(Some(offsets_topic), Duration::from_secs(30))
        .map_err(|e| ConnectorError::kafka(format!("metadata of {offsets_topic}"), e))?;
    consumer
        .assign(&tpl)
        .map_err(|e| ConnectorError::kafka(format!("assigning {offsets_topic}"), e))?;
    let deadline = Instant::now() + wait;
    let mut done = BTreeSet::new();
    // partition -> where the reader is, for the error that says how far.
    let mut at_now: BTreeMap<i32, i64> = BTreeMap::new();
    while done.len() < ends.len() {
        if Instant::now() > deadline {
            let short: Vec<String> = ends
                .iter()
                .filter(|(p, _)| !done.contains(*p))
                .map(|(p, end)| match at_now.get(p) {
                    Some(at) => format!("partition {p} at {at} of {end}"),
                    None => format!("partition {p} not yet read, its end {end}"),
                })
                .collect();
            return Err(ConnectorError::Other(format!(
                "reading {offsets_topic}: not at its end after {wait:?} ({}; a transaction \
                 left open holds a read_committed reader back until it ends or times out)",
                short.join(", ")
            )));
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                if let (Some(key), Some(value)) = (m.key(), m.payload())
                    && let Some(rest) = String::from_utf8_lossy(key).strip_prefix(prefix)
                {
                    out.insert(
                        rest.to_string(),
                        String::from_utf8_lossy(value).into_owned(),
                    );
                }
            }
            Some(Err(e)) => {
                return Err(ConnectorError::kafka(format!("reading {offsets_topic}"), e));
            }
            None => {}
        }
        // Transaction markers and aborted records move the position without
        // a message, so the position, not the last message, says where we are.
        let position = consumer
            .position()
            .map_err(|e| ConnectorError::kafka(format!("reading {offsets_topic}"), e))?;
        for e in position.elements() {
            if let (Offset::Offset(at), Some(end)) = (e.offset(), ends.get(&e.partition())) {
                at_now.insert(e.partition(), at);
                if at >= *end {
                    done.insert(e.partition());
                }
            }
        }
    }
    Ok(out)
}

/// run -> last committed epoch of `member`, from the records under a name.
pub(super) fn member_markers(
    records: &BTreeMap<String, String>,
    member: u32,
) -> BTreeMap<String, u64> {
    records
        .iter()
        .filter_map(|(field, epoch)| {
            let (run, m) = parse_marker_field(field)?;
            (m == member).then(|| Some((run.to_string(), epoch.parse().ok()?)))?
        })
        .collect()
}

/// The offsets an exactly-once Kafka sink committed under `checkpoint` for
/// source `topic`: partition -> next offset to read.
pub fn stored_offsets(
    brokers: &str,
    offsets_topic: &str,
    checkpoint: &str,
    topic: &str,
) -> Result<BTreeMap<i32, i64>> {
    let all = read_latest(
        brokers,
        offsets_topic,
        &format!("{checkpoint}/"),
        Duration::from_secs(60),
    )?;
    Ok(all
        .into_iter()
        .filter_map(|(k, v)| {
            let (t, p) = k.rsplit_once('/')?;
            (t == topic).then(|| Some((p.parse().ok()?, v.parse().ok()?)))?
        })
        .collect())
}
