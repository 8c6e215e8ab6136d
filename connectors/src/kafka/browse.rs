//! The topics of a Kafka cluster for `skein ui`: each with its partitions'
//! offsets, and a sample of a topic's most recent records with the table
//! that would read them. Reads with a consumer that has no group: it
//! commits nothing and moves no one's offsets.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use skein_clients::error::{ConnectorError, Result};
use skein_engine::catalog::browse::{
    PartitionRange, Sample, SampledRecord, SourceBrowser, StreamListing,
};
use skein_formats::sniff::{sample, shown};

use super::{KIND, KafkaRole, client_config};

/// How long metadata and offset requests may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a sample may take to read.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(10);

/// The options that name the cluster (and a registry) to the browser.
const BROKERS: &str = "bootstrap.servers";

/// Lists and samples the topics of the cluster its options name.
pub struct KafkaBrowser;

fn consumer(options: &BTreeMap<String, String>) -> Result<BaseConsumer> {
    if !options.contains_key(BROKERS) {
        return Err(ConnectorError::Config(format!(
            "{BROKERS} is needed to list a cluster's topics"
        )));
    }
    // Only the cluster's client properties: a registry's options are not.
    let client: BTreeMap<String, String> = options
        .iter()
        .filter(|(k, _)| !k.starts_with("schema.registry."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut config = client_config(KafkaRole::Consumer, &client, &[]);
    config.set("enable.auto.commit", "false");
    config.set("group.id", "skein-ui-browse");
    config.set("enable.partition.eof", "true");
    Ok(config.create()?)
}

fn ranges(c: &BaseConsumer, topic: &str, partitions: &[i32]) -> Result<Vec<PartitionRange>> {
    let mut out = vec![];
    for &p in partitions {
        let (low, high) = c
            .fetch_watermarks(topic, p, ASK_TIMEOUT)
            .map_err(|e| ConnectorError::kafka(format!("offsets of {topic}/{p}"), e))?;
        out.push(PartitionRange {
            partition: p.to_string(),
            start: Some(low),
            end: Some(high),
        });
    }
    Ok(out)
}

fn held(ranges: &[PartitionRange]) -> Option<i64> {
    ranges
        .iter()
        .map(|r| Some(r.end? - r.start?))
        .sum::<Option<i64>>()
}

fn list_blocking(options: &BTreeMap<String, String>) -> Result<Vec<StreamListing>> {
    let c = consumer(options)?;
    let metadata = c
        .fetch_metadata(None, ASK_TIMEOUT)
        .map_err(|e| ConnectorError::kafka("listing topics", e))?;
    let mut out = vec![];
    for t in metadata.topics() {
        // The broker's own (__consumer_offsets) and unreadable ones.
        if t.name().starts_with("__") || t.error().is_some() {
            continue;
        }
        let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
        ids.sort_unstable();
        let partitions = ranges(&c, t.name(), &ids)?;
        out.push(StreamListing {
            name: t.name().to_string(),
            records: held(&partitions),
            partitions,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn sample_blocking(
    options: &BTreeMap<String, String>,
    topic: &str,
    wanted: usize,
) -> Result<Sample> {
    let c = consumer(options)?;
    let metadata = c
        .fetch_metadata(Some(topic), ASK_TIMEOUT)
        .map_err(|e| ConnectorError::kafka(format!("the partitions of {topic}"), e))?;
    let found = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
        .ok_or_else(|| ConnectorError::Other(format!("topic {topic} not found")))?;
    let ids: Vec<i32> = found.partitions().iter().map(|p| p.id()).collect();
    let partitions = ranges(&c, topic, &ids)?;
    // The last `wanted` of each partition: the newest `wanted` are among them.
    let mut assignment = TopicPartitionList::new();
    let mut to_read = 0usize;
    for r in &partitions {
        let (Some(low), Some(high)) = (r.start, r.end) else {
            continue;
        };
        let from = (high - wanted as i64).max(low);
        if from < high {
            let p: i32 = r.partition.parse().unwrap_or_default();
            assignment
                .add_partition_offset(topic, p, Offset::Offset(from))
                .map_err(|e| ConnectorError::kafka("assigning the sample's partitions", e))?;
            to_read += (high - from) as usize;
        }
    }
    let mut records: Vec<(i64, SampledRecord, Vec<u8>)> = vec![];
    if to_read > 0 {
        c.assign(&assignment)
            .map_err(|e| ConnectorError::kafka("assigning the sample's partitions", e))?;
        let ends: BTreeMap<i32, i64> = partitions
            .iter()
            .filter_map(|r| Some((r.partition.parse().ok()?, r.end?)))
            .collect();
        let started = Instant::now();
        let mut read = 0usize;
        while read < to_read && started.elapsed() < SAMPLE_TIMEOUT {
            let Some(polled) = c.poll(Duration::from_millis(200)) else {
                continue;
            };
            // A partition's end (enable.partition.eof) is no record.
            let Ok(m) = polled else { continue };
            if ends
                .get(&m.partition())
                .is_some_and(|end| m.offset() >= *end)
            {
                continue;
            }
            read += 1;
            let ts = m.timestamp().to_millis();
            records.push((
                ts.unwrap_or(i64::MIN),
                SampledRecord {
                    partition: m.partition().to_string(),
                    offset: m.offset().to_string(),
                    timestamp_ms: ts,
                    key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    value: m.payload().map(shown).unwrap_or_default(),
                },
                m.payload().unwrap_or_default().to_vec(),
            ));
        }
    }
    let declared = BTreeMap::from([(BROKERS.to_string(), options[BROKERS].clone())]);
    sample(records, wanted, options, topic, declared)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> skein_engine::Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| e.for_source(KIND)),
        Err(e) => Err(skein_engine::EngineError::Context(format!(
            "looking at Kafka: {e}"
        ))),
    }
}

#[async_trait]
impl SourceBrowser for KafkaBrowser {
    async fn list(
        &self,
        options: &BTreeMap<String, String>,
    ) -> skein_engine::Result<Vec<StreamListing>> {
        let options = options.clone();
        blocking(move || list_blocking(&options)).await
    }

    async fn sample(
        &self,
        options: &BTreeMap<String, String>,
        stream: &str,
        records: usize,
    ) -> skein_engine::Result<Sample> {
        let (options, topic) = (options.clone(), stream.to_string());
        blocking(move || sample_blocking(&options, &topic, records)).await
    }
}
