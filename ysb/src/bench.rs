//! What `ysb bench` measures besides the query: the ceiling of a raw
//! rdkafka drain (`--events`), and the report of a latency bench (`--rate`).

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use serde::{Deserialize, Serialize};
use skein_connectors::kafka::{BatchConsumer, FETCH_DEFAULTS, Fetched};

use crate::error::{Result, fail};
use crate::now_ms;

/// Read every record of `topic` with a plain rdkafka consumer, no parsing:
/// the ceiling a Kafka reader on this machine can reach. Returns (records, s).
pub fn raw_drain(brokers: &str, topic: &str) -> Result<(u64, f64)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("skein-raw-drain-{}", now_ms()))
        .set("enable.auto.commit", "false");
    // The same fetch settings as the Kafka source, for a fair comparison.
    for (key, value) in FETCH_DEFAULTS {
        config.set(*key, *value);
    }
    let consumer: BaseConsumer = config.create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let Some(t) = metadata.topics().first() else {
        fail!("raw drain: no metadata for {topic}");
    };
    let mut tpl = TopicPartitionList::new();
    let mut total = 0i64;
    for p in t.partitions() {
        let (low, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
        total += high - low;
        tpl.add_partition_offset(topic, p.id(), Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    // librdkafka's batch API, as the Kafka source reads: a `poll` per record
    // caps one thread near 0.55 M records/s here (docs/benchmarks.md).
    let consumer = BatchConsumer::new(consumer);
    let started = Instant::now();
    let mut n = 0i64;
    let mut bytes = 0usize;
    let mut error = None;
    while n < total {
        if started.elapsed() > Duration::from_secs(600) {
            fail!("raw drain: {n} of {total} records after 10 minutes");
        }
        consumer.read(
            Duration::from_millis(100),
            usize::MAX,
            |fetched| match fetched {
                Fetched::Record { payload, .. } => {
                    bytes += payload.len();
                    n += 1;
                }
                Fetched::Error(e) => error = Some(e),
            },
        );
        if let Some(e) = error.take() {
            fail!("raw drain: {e}");
        }
    }
    tracing::debug!(bytes, "raw drain done");
    Ok((n as u64, started.elapsed().as_secs_f64()))
}

/// What `ysb bench --rate R --duration D` reports.
#[derive(Debug, Serialize, Deserialize)]
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
    /// Times windows closed under load (YSB's windows are 10 s: a 300 s
    /// load closes 30); the tail percentiles need some 30 of them.
    pub closings: usize,
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
    /// The query at the target rate for a month (its CPU figure includes
    /// the publisher, which runs in the same process).
    pub cost: skein_cost::CostReport,
}

/// The 1-minute load average, for the record of how busy the machine was.
pub fn load_avg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A bench's own topic, so that it reads exactly the events of its run.
pub fn fresh_topic() -> String {
    format!("ad-events-bench-{}", now_ms())
}
