//! Kafka helpers of the tests: fresh topics, writing records into chosen
//! partitions, and reading a topic's end offsets, first records and
//! committed records.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(10);

/// Creates `topic` with `partitions` partitions; fails the test if it cannot.
pub fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the admin client");
    let created = runtime
        .block_on(super::within(
            30,
            "creating the topic",
            admin.create_topics(&[new], &options),
        ))
        .unwrap_or_else(|e| panic!("create_topics on {brokers}: {e} ({})", super::START_HINT));
    for result in created {
        result.unwrap_or_else(|(name, code)| panic!("creating topic {name}: {code}"));
    }
}

/// An idempotent producer writing to explicit partitions, so the order of
/// each partition is the order of the calls.
pub struct PartitionWriter {
    producer: BaseProducer,
    topic: String,
}

impl PartitionWriter {
    pub fn new(brokers: &str, topic: &str) -> Self {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "30000")
            .create()
            .expect("producer");
        PartitionWriter {
            producer,
            topic: topic.to_string(),
        }
    }

    pub fn send(&self, partition: i32, payload: &str) {
        let mut record = BaseRecord::<(), str>::to(&self.topic)
            .partition(partition)
            .payload(payload);
        let started = Instant::now();
        loop {
            match self.producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    assert!(
                        started.elapsed() < Duration::from_secs(60),
                        "{}: the producer queue stayed full for 60 s",
                        self.topic
                    );
                    record = back;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => panic!("producing to {}/{partition}: {e}", self.topic),
            }
        }
        self.producer.poll(Duration::ZERO);
    }

    /// Waits until everything sent is acknowledged (or failed for good).
    pub fn flush(&self) {
        self.producer
            .flush(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("flushing the producer of {}: {e}", self.topic));
    }
}

fn consumer(brokers: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", super::unique_name("skein-tests"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer")
}

/// The partition ids of `topic`, sorted.
fn partitions(consumer: &BaseConsumer, topic: &str) -> Vec<i32> {
    let metadata = consumer
        .fetch_metadata(Some(topic), TIMEOUT)
        .unwrap_or_else(|e| panic!("metadata of {topic}: {e}"));
    let mut ids: Vec<i32> = metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| p.id())
        .collect();
    ids.sort();
    ids
}

/// The end offset (high watermark) of every partition of `topic`, by id.
pub fn end_offsets(brokers: &str, topic: &str) -> Vec<i64> {
    let consumer = consumer(brokers);
    partitions(&consumer, topic)
        .into_iter()
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p, TIMEOUT)
                .unwrap_or_else(|e| panic!("watermarks of {topic}/{p}: {e}"))
                .1
        })
        .collect()
}

/// The payload of the first record of every non-empty partition of `topic`.
pub fn first_records(brokers: &str, topic: &str) -> Vec<Vec<u8>> {
    let consumer = consumer(brokers);
    let ends = end_offsets(brokers, topic);
    let mut assignment = TopicPartitionList::new();
    for (p, end) in partitions(&consumer, topic).into_iter().zip(&ends) {
        if *end > 0 {
            assignment
                .add_partition_offset(topic, p, Offset::Beginning)
                .expect("assignment");
        }
    }
    let wanted = assignment.count();
    consumer.assign(&assignment).expect("assign partitions");
    let mut firsts = std::collections::BTreeMap::new();
    let started = Instant::now();
    while firsts.len() < wanted {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{topic}: first records of {} of {wanted} partitions in 30 s",
            firsts.len()
        );
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m.unwrap_or_else(|e| panic!("reading {topic}: {e}"));
            firsts
                .entry(m.partition())
                .or_insert_with(|| m.payload().unwrap_or_default().to_vec());
        }
    }
    firsts.into_values().collect()
}

/// A committed record: (partition, key, value).
pub type Record = (i32, Option<Vec<u8>>, Vec<u8>);

/// Every committed record of `topic` (read_committed), each partition's in
/// offset order. It reads to each partition's end rather than to a count
/// from the watermarks: transaction markers take offsets too.
pub fn committed_records(brokers: &str, topic: &str) -> Vec<Record> {
    records_as(brokers, topic, "read_committed")
}

/// Records per partition of `topic` as a read_committed reader sees them,
/// as a read_uncommitted one does, and its end offset: what to print when
/// committed rows are missing (an open transaction holds back what
/// read_committed readers see; an aborted one's rows are only uncommitted).
pub fn partition_counts(brokers: &str, topic: &str) -> Vec<(i32, usize, usize, i64)> {
    let count = |isolation| {
        let mut n = BTreeMap::<i32, usize>::new();
        for (p, _, _) in records_as(brokers, topic, isolation) {
            *n.entry(p).or_default() += 1;
        }
        n
    };
    let (committed, all) = (count("read_committed"), count("read_uncommitted"));
    end_offsets(brokers, topic)
        .into_iter()
        .enumerate()
        .map(|(p, end)| {
            let p = p as i32;
            let get = |m: &BTreeMap<i32, usize>| m.get(&p).copied().unwrap_or(0);
            (p, get(&committed), get(&all), end)
        })
        .collect()
}

fn records_as(brokers: &str, topic: &str, isolation: &str) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", super::unique_name("skein-tests"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .set("enable.partition.eof", "true")
        // The end is known by a fetch that finds nothing: not held 500 ms.
        .set("fetch.wait.max.ms", "10")
        .create()
        .expect("consumer");
    let ids = partitions(&consumer, topic);
    let mut assignment = TopicPartitionList::new();
    for p in &ids {
        assignment
            .add_partition_offset(topic, *p, Offset::Beginning)
            .expect("assignment");
    }
    consumer.assign(&assignment).expect("assign partitions");
    let (mut out, mut ended) = (vec![], std::collections::BTreeSet::new());
    let started = Instant::now();
    while ended.len() < ids.len() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{topic}: read {} records, not at the end after 60 s",
            out.len()
        );
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => out.push((
                m.partition(),
                m.key().map(<[u8]>::to_vec),
                m.payload().unwrap_or_default().to_vec(),
            )),
            Some(Err(KafkaError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    out
}
