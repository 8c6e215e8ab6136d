//! The Redis sink on the real server: the YSB layout with its offsets in the
//! same MULTI/EXEC, a replayed write that changes nothing, and the generic
//! hash layout with a key template and a TTL.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use redis::AsyncCommands;
use skein_engine::payload::SourceOffset;
use skein_engine::sink::{SinkConfig, SinkRegistry, SinkWrite};
use skein_engine::source::SourceRegistry;
use skein_sinks::redis::stored_offsets;

fn ysb_batch(campaign: &str, windows: &[i64], counts: &[i64]) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("campaign_id", DataType::Utf8, false),
        Field::new(
            "window_start",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ),
        Field::new("seen_count", DataType::Int64, false),
    ]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![campaign; windows.len()])),
        Arc::new(TimestampMillisecondArray::from(windows.to_vec())),
        Arc::new(Int64Array::from(counts.to_vec())),
    ];
    RecordBatch::try_new(schema, columns).unwrap()
}

fn offsets(topic: &str, at: i64) -> Vec<SourceOffset> {
    (0..2)
        .map(|p| SourceOffset {
            source: topic.into(),
            partition: p,
            offset: at + i64::from(p),
        })
        .collect()
}

fn sink(url: &str, options: &[(&str, &str)]) -> Arc<dyn skein_engine::sink::Sink> {
    let mut sinks = SinkRegistry::default();
    skein_sinks::register(&mut sinks, &mut SourceRegistry::default());
    sinks
        .create(&SinkConfig {
            kind: "REDIS".into(),
            location: url.into(),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        })
        .expect("redis sink")
}

#[tokio::test]
async fn ysb_layout_is_exactly_once() {
    let url = common::require_redis();
    let checkpoint = common::unique_name("sink-test");
    let campaign = common::unique_name("campaign");
    let topic = "events";
    let sink = sink(&url, &[("layout", "ysb"), ("checkpoint", &checkpoint)]);
    let batch = ysb_batch(&campaign, &[10_000, 20_000], &[3, 4]);
    let write = |epoch, batch: RecordBatch, at| SinkWrite {
        query: "q",
        run: "",
        epoch,
        member: 0,
        schema: batch.schema(),
        batches: vec![batch],
        offsets: offsets(topic, at),
        last: false,
    };
    sink.write(write(0, batch.clone(), 100))
        .await
        .expect("first write");
    // The same epoch again (a replay): nothing changes.
    sink.write(write(0, batch.clone(), 100))
        .await
        .expect("replay");
    // A later epoch adds to the same windows.
    sink.write(write(1, ysb_batch(&campaign, &[10_000], &[5]), 150))
        .await
        .expect("second epoch");

    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let hash: HashMap<String, String> = con.hgetall(&campaign).await.unwrap();
    assert_eq!(hash.len(), 3, "two windows and the window list: {hash:?}");
    let count = |w: &str| {
        let uuid = hash[w].clone();
        let mut con = con.clone();
        async move {
            let n: i64 = con.hget(&uuid, "seen_count").await.unwrap();
            let updated: i64 = con.hget(&uuid, "time_updated").await.unwrap();
            assert!(updated > 0);
            n
        }
    };
    assert_eq!(count("10000").await, 8);
    assert_eq!(count("20000").await, 4);
    let list: Vec<String> = con.lrange(&hash["windows"], 0, -1).await.unwrap();
    assert_eq!(list.len(), 2, "each window listed once: {list:?}");
    let stored = stored_offsets(&url, &checkpoint, topic).await.unwrap();
    assert_eq!(stored, BTreeMap::from([(0, 150), (1, 151)]));
}

#[tokio::test]
async fn hash_layout_with_key_template_and_ttl() {
    let url = common::require_redis();
    let prefix = common::unique_name("user");
    let sink = sink(
        &url,
        &[
            ("layout", "hash"),
            ("key", &format!("{prefix}:{{campaign_id}}")),
            ("ttl.seconds", "60"),
        ],
    );
    let batch = ysb_batch("c1", &[10_000], &[7]);
    sink.write(SinkWrite {
        query: "q",
        run: "",
        epoch: 0,
        member: 0,
        schema: batch.schema(),
        batches: vec![batch],
        offsets: vec![],
        last: false,
    })
    .await
    .expect("write");
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("{prefix}:c1");
    let hash: HashMap<String, String> = con.hgetall(&key).await.unwrap();
    assert_eq!(hash["seen_count"], "7");
    assert!(hash.contains_key("window_start"));
    let ttl: i64 = con.ttl(&key).await.unwrap();
    assert!(ttl > 0 && ttl <= 60, "ttl {ttl}");
}
