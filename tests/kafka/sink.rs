//! The Kafka sink's exactly-once delivery on the real broker: eight members
//! write their epochs; a "restarted process" (new sink instances, the same
//! run) replays some of them, including an epoch some members had committed
//! and others not, and one a member left in an open transaction; a
//! `read_committed` reader sees every row once. A new run of the same query
//! is not taken for a replay. (tests/publish/sinks.rs has the `checkpoint` option
//! and its source offsets.)

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::future::join_all;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use skein_engine::sink::{Sink, SinkRows, SinkWrite};
use skein_sinks::kafka::KafkaSink;

const MEMBERS: u32 = 8;
const ROWS: i64 = 3;
const QUERY: &str = "q-kafka-sink-test";

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]))
}

/// The rows of (run number, epoch, member): distinct across all three.
fn rows(run: i64, epoch: u64, member: u32) -> Vec<i64> {
    (0..ROWS)
        .map(|i| run * 1_000_000 + epoch as i64 * 1_000 + i64::from(member) * 10 + i)
        .collect()
}

fn options(brokers: &str, offsets_topic: &str) -> BTreeMap<String, String> {
    [
        ("bootstrap.servers", brokers),
        ("offsets.topic", offsets_topic),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

async fn write(sink: &KafkaSink, run: &str, run_n: i64, epoch: u64, member: u32) {
    let batch = RecordBatch::try_new(
        schema(),
        vec![Arc::new(Int64Array::from(rows(run_n, epoch, member)))],
    )
    .unwrap();
    sink.write(SinkWrite {
        query: QUERY,
        run,
        epoch,
        member,
        schema: schema(),
        rows: SinkRows::Append(vec![batch]),
        offsets: vec![],
        last: false,
    })
    .await
    .unwrap_or_else(|e| panic!("run {run} epoch {epoch} member {member}: {e}"));
}

/// One sink instance per member, as each function of a group has its own.
fn instances(topic: &str, options: &BTreeMap<String, String>) -> Vec<KafkaSink> {
    (0..MEMBERS)
        .map(|_| KafkaSink::new(topic, options).expect("kafka sink"))
        .collect()
}

/// Each member writes `epochs` in order; the members run side by side.
async fn write_epochs(sinks: &[KafkaSink], run: &str, epochs: &[(u32, Vec<u64>)]) {
    join_all(epochs.iter().map(|(member, list)| async move {
        for epoch in list {
            write(&sinks[*member as usize], run, 1, *epoch, *member).await;
        }
    }))
    .await;
}

/// Every value of `n` a read_committed reader finds in `topic`, sorted.
fn read_committed(brokers: &str, topic: &str) -> Vec<i64> {
    let mut out: Vec<i64> = common::kafka::committed_records(brokers, topic)
        .into_iter()
        .map(|(_, _, value)| {
            let v: serde_json::Value = serde_json::from_slice(&value).unwrap();
            v["n"].as_i64().unwrap()
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_members_replayed_after_a_restart_write_each_row_once() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("kafka-sink-out");
    let offsets_topic = common::unique_name("kafka-sink-offsets");
    skein_sinks::kafka::ensure_topic(&brokers, &topic, 3, &[])
        .await
        .unwrap();
    let options = options(&brokers, &offsets_topic);
    let run = common::unique_name("run");

    // The first process: epochs 0..=4 from every member, then epoch 5 from
    // members 0..4 only, then it "crashes".
    let first = instances(&topic, &options);
    let all: Vec<(u32, Vec<u64>)> = (0..MEMBERS).map(|m| (m, (0..=4).collect())).collect();
    common::within(60, "first process", write_epochs(&first, &run, &all)).await;
    let half: Vec<(u32, Vec<u64>)> = (0..4).map(|m| (m, vec![5])).collect();
    common::within(30, "half of epoch 5", write_epochs(&first, &run, &half)).await;
    // A replay within the same process (a retried write) writes nothing.
    write(&first[0], &run, 1, 4, 0).await;
    drop(first);

    // Member 7 crashed inside its transaction of epoch 5: rows and marker
    // sent, never committed. Its successor's init_transactions aborts it.
    let open: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("transactional.id", format!("skein-{QUERY}-7"))
        .create()
        .expect("producer");
    let open = tokio::task::spawn_blocking(move || {
        open.init_transactions(Duration::from_secs(30)).unwrap();
        open.begin_transaction().unwrap();
        open
    })
    .await
    .unwrap();
    for n in rows(1, 5, 7) {
        let value = format!("{{\"n\":{n}}}");
        open.send(BaseRecord::<(), _>::to(&topic).payload(&value))
            .unwrap();
    }
    let marker_key = format!("{QUERY}/{run}/7");
    open.send(BaseRecord::to(&offsets_topic).key(&marker_key).payload("5"))
        .unwrap();
    open.flush(Duration::from_secs(30)).unwrap();

    // The restarted process (same run) replays from epoch 3 and goes on.
    let second = instances(&topic, &options);
    let replay: Vec<(u32, Vec<u64>)> = (0..MEMBERS).map(|m| (m, (3..=6).collect())).collect();
    common::within(
        90,
        "restarted process",
        write_epochs(&second, &run, &replay),
    )
    .await;
    drop(open);

    // The same query started afresh is a new run: its epoch 0 is written.
    let fresh = KafkaSink::new(&topic, &options).unwrap();
    write(&fresh, &common::unique_name("run"), 2, 0, 0).await;

    let mut want: Vec<i64> = (0..MEMBERS)
        .flat_map(|m| (0..=6).flat_map(move |e| rows(1, e, m)))
        .chain(rows(2, 0, 0))
        .collect();
    want.sort();
    let got = tokio::task::spawn_blocking(move || read_committed(&brokers, &topic))
        .await
        .unwrap();
    assert_eq!(got.len(), want.len(), "rows missing or doubled");
    assert_eq!(got, want);
}

#[test]
fn delivery_option_is_checked() {
    let mut options = options("127.0.0.1:1", "o");
    options.insert("delivery".into(), "maybe".into());
    let err = KafkaSink::new("t", &options).err().unwrap().to_string();
    assert!(err.contains("'delivery'") && !err.contains('\n'), "{err}");
    options.insert("delivery".into(), "at-least-once".into());
    assert!(KafkaSink::new("t", &options).is_ok());
    options.insert("checkpoint".into(), "cp".into());
    let err = KafkaSink::new("t", &options).err().unwrap().to_string();
    assert!(err.contains("'checkpoint'"), "{err}");
}
