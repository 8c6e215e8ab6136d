//! The Redis sink on the real server: YSB's layout (`STORED AS YSB_REDIS`,
//! through the Redis sink's extension point) with its offsets in the
//! same MULTI/EXEC, a replayed write that changes nothing, the generic hash
//! layout with a key template and a TTL; eight members whose epochs a
//! "restarted process" replays, each write counted once in the hash, list
//! and YSB layouts; `string` and `hash` refused with `'emit' 'updates'`.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use futures::future::join_all;
use redis::AsyncCommands;
use skein_engine::catalog::Catalog;
use skein_engine::payload::SourceOffset;
use skein_engine::sink::{Sink, SinkConfig, SinkRows, SinkWrite};
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
            position: None,
        })
        .collect()
}

/// A `STORED AS REDIS` sink.
fn sink(url: &str, options: &[(&str, &str)]) -> Arc<dyn Sink> {
    sink_of("REDIS", url, options)
}

/// A `STORED AS YSB_REDIS` sink.
fn ysb_sink(url: &str, options: &[(&str, &str)]) -> Arc<dyn Sink> {
    sink_of(skein_ysb::KIND, url, options)
}

fn sink_of(kind: &str, url: &str, options: &[(&str, &str)]) -> Arc<dyn Sink> {
    let mut catalog = Catalog::default();
    skein_sinks::register(&mut catalog);
    skein_ysb::register_sinks(&mut catalog);
    catalog
        .create_sink(&SinkConfig {
            kind: kind.into(),
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
    let sink = ysb_sink(&url, &[("checkpoint", &checkpoint)]);
    let batch = ysb_batch(&campaign, &[10_000, 20_000], &[3, 4]);
    let write = |epoch, batch: RecordBatch, at| SinkWrite {
        query: "q",
        run: "",
        epoch,
        member: 0,
        schema: batch.schema(),
        rows: SinkRows::Append(vec![batch]),
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
        rows: SinkRows::Append(vec![batch]),
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

const MEMBERS: u32 = 8;

/// A two-column batch (id, v) for the generic layouts: one row per write,
/// named by (run, epoch, member).
fn generic_batch(run: i64, epoch: u64, member: u32) -> RecordBatch {
    let id = format!("{run}-{epoch}-{member}");
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("v", DataType::Int64, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(vec![id])),
            Arc::new(Int64Array::from(vec![
                run * 1_000_000 + epoch as i64 * 100 + i64::from(member),
            ])),
        ],
    )
    .unwrap()
}

/// Drives eight members through a crash and a restart with the same run:
/// the first process writes epochs 0..=4, then epoch 5 from members 0..4
/// only; the restarted one replays 3..=6. Then a new run of the same query
/// writes its epoch 0 from member 0. `batch` gives each write's rows.
async fn crash_and_replay(
    url: &str,
    sink: fn(&str, &[(&str, &str)]) -> Arc<dyn Sink>,
    options: &[(&str, &str)],
    batch: impl Fn(i64, u64, u32) -> RecordBatch + Sync,
) {
    let run = common::unique_name("run");
    let write = |sink: Arc<dyn Sink>, run: String, run_n: i64, epochs: Vec<u64>, member: u32| {
        let batch = &batch;
        async move {
            for epoch in epochs {
                let b = batch(run_n, epoch, member);
                sink.write(SinkWrite {
                    query: "q-redis-sink-test",
                    run: &run,
                    epoch,
                    member,
                    schema: b.schema(),
                    rows: SinkRows::Append(vec![b]),
                    offsets: vec![],
                    last: false,
                })
                .await
                .unwrap_or_else(|e| panic!("epoch {epoch} member {member}: {e}"));
            }
        }
    };
    let first: Vec<Arc<dyn Sink>> = (0..MEMBERS).map(|_| sink(url, options)).collect();
    join_all((0..MEMBERS).map(|m| {
        let epochs = if m < 4 {
            (0..=5).collect()
        } else {
            (0..=4).collect()
        };
        write(first[m as usize].clone(), run.clone(), 1, epochs, m)
    }))
    .await;
    // A retried write in the same process changes nothing.
    write(first[0].clone(), run.clone(), 1, vec![5], 0).await;
    let second: Vec<Arc<dyn Sink>> = (0..MEMBERS).map(|_| sink(url, options)).collect();
    join_all((0..MEMBERS).map(|m| {
        write(
            second[m as usize].clone(),
            run.clone(),
            1,
            (3..=6).collect(),
            m,
        )
    }))
    .await;
    let fresh = sink(url, options);
    write(fresh, common::unique_name("run"), 2, vec![0], 0).await;
}

/// (run, epoch, member) of every write that must have landed once.
fn expected_writes() -> Vec<(i64, u64, u32)> {
    let mut out: Vec<(i64, u64, u32)> = (0..MEMBERS)
        .flat_map(|m| (0..=6).map(move |e| (1, e, m)))
        .collect();
    out.push((2, 0, 0));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn list_layout_appends_each_write_once_at_group_size_eight() {
    let url = common::require_redis();
    let key = common::unique_name("list");
    let checkpoint = common::unique_name("cp");
    let options = [
        ("layout", "list"),
        ("key", key.as_str()),
        ("value", "id"),
        ("emit", "updates"),
        ("checkpoint", checkpoint.as_str()),
    ];
    crash_and_replay(&url, sink, &options, generic_batch).await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let mut got: Vec<String> = con.lrange(&key, 0, -1).await.unwrap();
    got.sort();
    let mut want: Vec<String> = expected_writes()
        .into_iter()
        .map(|(r, e, m)| format!("{r}-{e}-{m}"))
        .collect();
    want.sort();
    assert_eq!(got, want, "every write appended once");
    // The markers: member m of the first run committed epoch 6.
    let markers: HashMap<String, u64> = con
        .hgetall(skein_sinks::redis::epochs_key(&checkpoint))
        .await
        .unwrap();
    assert_eq!(markers.len(), MEMBERS as usize + 1, "{markers:?}");
    assert_eq!(
        markers.values().filter(|e| **e == 6).count(),
        MEMBERS as usize
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hash_layout_holds_every_write_at_group_size_eight() {
    let url = common::require_redis();
    let prefix = common::unique_name("h");
    let key = format!("{prefix}:{{id}}");
    crash_and_replay(
        &url,
        sink,
        &[("layout", "hash"), ("key", &key)],
        generic_batch,
    )
    .await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    for (r, e, m) in expected_writes() {
        let v: i64 = con
            .hget(format!("{prefix}:{r}-{e}-{m}"), "v")
            .await
            .unwrap_or_else(|err| panic!("{r}-{e}-{m}: {err}"));
        assert_eq!(v, r * 1_000_000 + e as i64 * 100 + i64::from(m));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ysb_layout_adds_each_delta_once_at_group_size_eight() {
    let url = common::require_redis();
    let campaign = common::unique_name("campaign");
    // Every member adds `member + 1` views to the same two windows each
    // epoch: the members create the windows concurrently.
    let c = campaign.clone();
    let batch = move |run: i64, _epoch: u64, member: u32| {
        let n = i64::from(member) + 1 + if run == 2 { 1000 } else { 0 };
        ysb_batch(&c, &[10_000, 20_000], &[n, n])
    };
    crash_and_replay(&url, ysb_sink, &[("emit", "updates")], batch).await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let hash: HashMap<String, String> = con.hgetall(&campaign).await.unwrap();
    assert_eq!(hash.len(), 3, "two windows and the window list: {hash:?}");
    let per_epoch: i64 = (1..=i64::from(MEMBERS)).sum();
    for window in ["10000", "20000"] {
        let n: i64 = con.hget(&hash[window], "seen_count").await.unwrap();
        assert_eq!(n, 7 * per_epoch + 1001, "window {window}");
    }
    let list: Vec<String> = con.lrange(&hash["windows"], 0, -1).await.unwrap();
    assert_eq!(list.len(), 2, "each window listed once: {list:?}");
}

#[test]
fn string_and_hash_layouts_refuse_emit_updates() {
    let config = |layout: &str, emit: Option<&str>| SinkConfig {
        kind: "REDIS".into(),
        location: "redis://127.0.0.1:1".into(),
        options: [("layout", layout), ("key", "k:{id}"), ("value", "v")]
            .into_iter()
            .chain(emit.map(|e| ("emit", e)))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    for layout in ["string", "hash"] {
        let err = skein_sinks::redis::check_config(&config(layout, Some("updates")))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("{layout:?}")) && err.contains("'list'") && !err.contains('\n'),
            "{err}"
        );
        skein_sinks::redis::check_config(&config(layout, None)).expect("whole windows are fine");
    }
    skein_sinks::redis::check_config(&config("list", Some("updates")))
        .expect("appends merge deltas");
    // YSB's layout is a sink kind of its own now.
    let err = skein_sinks::redis::check_config(&config("ysb", None))
        .unwrap_err()
        .to_string();
    assert!(err.contains("YSB_REDIS") && !err.contains('\n'), "{err}");
}
