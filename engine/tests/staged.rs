//! Multi-stage runs through the in-process runtime must give the same rows
//! as plain single-process DataFusion on the same input.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use datafusion::arrow::array::{Int64Array, StringArray, TimestampMillisecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use skein_engine::context::function_name;
use skein_engine::driver::run_local;
use skein_engine::exec::SourceTable;
use skein_engine::invoke::{InvocationType, Invoker};
use skein_engine::local::{Faults, LocalRuntime};
use skein_engine::payload::Encoding;
use skein_engine::planner::{PlanOptions, QueryPlan, plan_query, session};
use skein_engine::sink::{CollectSinkFactory, SinkRegistry};
use skein_engine::source::{MemorySource, MemorySourceFactory, SourceConfig, SourceRegistry};
use skein_engine::verify::{compare, single_process};
use std::sync::atomic::Ordering;

fn bid_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("bidder", DataType::Int64, false),
        Field::new("price", DataType::Int64, false),
        Field::new("channel", DataType::Utf8, false),
        Field::new(
            "date_time",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ),
    ]))
}

fn auction_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("category", DataType::Int64, false),
        Field::new("seller", DataType::Int64, false),
    ]))
}

/// Deterministic pseudo-random bids, event time increasing 10 ms a row,
/// spread over `parts` partitions round-robin (each in time order).
fn bids(rows: usize, parts: usize) -> Vec<Vec<RecordBatch>> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // auction, bidder, price, channel, date_time columns of each partition.
    type Columns = (Vec<i64>, Vec<i64>, Vec<i64>, Vec<String>, Vec<i64>);
    let mut cols: Vec<Columns> = vec![Default::default(); parts];
    for i in 0..rows {
        let c = &mut cols[i % parts];
        c.0.push((next() % 40) as i64 + 1000);
        c.1.push((next() % 25) as i64);
        c.2.push((next() % 1000) as i64);
        c.3.push(["apple", "google", "facebook", "baidu"][(next() % 4) as usize].to_string());
        c.4.push(1_700_000_000_000 + 10 * i as i64);
    }
    cols.into_iter()
        .map(|(a, b, p, ch, t)| {
            vec![
                RecordBatch::try_new(
                    bid_schema(),
                    vec![
                        Arc::new(Int64Array::from(a)),
                        Arc::new(Int64Array::from(b)),
                        Arc::new(Int64Array::from(p)),
                        Arc::new(StringArray::from(ch)),
                        Arc::new(TimestampMillisecondArray::from(t)),
                    ],
                )
                .unwrap(),
            ]
        })
        .collect()
}

fn auctions(parts: usize) -> Vec<Vec<RecordBatch>> {
    let mut out = vec![vec![]; parts];
    for id in 1000..1040i64 {
        let b = RecordBatch::try_new(
            auction_schema(),
            vec![
                Arc::new(Int64Array::from(vec![id])),
                Arc::new(Int64Array::from(vec![id % 5])),
                Arc::new(Int64Array::from(vec![id % 7])),
            ],
        )
        .unwrap();
        out[id as usize % parts].push(b);
    }
    out
}

struct Harness {
    ctx: SessionContext,
    runtime: Arc<LocalRuntime>,
    results: CollectSinkFactory,
    options: PlanOptions,
}

fn harness(group_size: usize, rows: usize) -> Harness {
    let memory = Arc::new(MemorySourceFactory::default());
    memory.insert("bid", MemorySource::new(bid_schema(), bids(rows, 2)));
    memory.insert("auction", MemorySource::new(auction_schema(), auctions(2)));
    let mut sources = SourceRegistry::default();
    sources.register("MEMORY", memory.clone());
    let results = CollectSinkFactory::default();
    let mut sinks = SinkRegistry::default();
    sinks.register("COLLECT", Arc::new(results.clone()));
    let ctx = session(&sources, group_size);
    for (name, schema) in [("bid", bid_schema()), ("auction", auction_schema())] {
        let mut config = SourceConfig {
            kind: "MEMORY".into(),
            location: name.into(),
            options: Default::default(),
        };
        if name == "bid" {
            config
                .options
                .insert("event_time".into(), "date_time".into());
        }
        let source = sources.create(&config, schema).unwrap();
        ctx.register_table(name, Arc::new(SourceTable::new(name, config, source)))
            .unwrap();
    }
    let runtime = LocalRuntime::new(sources, sinks, Arc::new(InMemory::new()));
    let options = PlanOptions {
        group_size,
        ..Default::default()
    };
    Harness {
        ctx,
        runtime,
        results,
        options,
    }
}

async fn run_and_verify(h: &Harness, sql: &str, epochs: u64) -> QueryPlan {
    let plan = plan_query(&h.ctx, sql, &h.options)
        .await
        .unwrap_or_else(|e| panic!("plan {sql}: {e}"));
    run_local(&plan, &h.runtime, &h.options, epochs, |_, _| {})
        .await
        .unwrap_or_else(|e| panic!("run {sql}: {e}\n{}", plan.explain()));
    let got =
        skein_engine::updating::in_query_order(&plan, h.results.sink(&plan.query_code).batches())
            .await
            .unwrap();
    let expected = single_process(&h.ctx, &plan).await.unwrap();
    let cmp = compare(&expected, &got, plan.ordered).unwrap();
    assert!(
        cmp.expected_rows > 0,
        "query returns no rows, which proves little: {sql}"
    );
    assert!(cmp.equal, "{sql}\n{:#?}\n{}", cmp, plan.explain());
    plan
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_and_projection() {
    let h = harness(4, 5_000);
    let plan = run_and_verify(
        &h,
        "SELECT auction, price * 2 AS p2, channel FROM bid WHERE price > 500",
        4,
    )
    .await;
    assert_eq!(plan.stages.len(), 1, "{}", plan.explain());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_by_shuffled_over_eight_members() {
    let h = harness(8, 20_000);
    let plan = run_and_verify(
        &h,
        "SELECT auction, count(*) AS n, sum(price) AS total, avg(price) AS mean, max(channel) AS ch FROM bid GROUP BY auction",
        5,
    )
    .await;
    let group = plan
        .stages
        .iter()
        .find(|s| s.members == 8)
        .expect("a group of 8");
    assert_eq!(group.concurrency, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_and_self_join() {
    let h = harness(4, 6_000);
    run_and_verify(
        &h,
        "SELECT a.category, count(*) AS n, sum(b.price) AS s FROM bid b JOIN auction a ON b.auction = a.id GROUP BY a.category",
        3,
    )
    .await;
    run_and_verify(
        &h,
        "SELECT b1.auction, b1.bidder, b2.price AS other FROM bid b1 JOIN bid b2 \
         ON b1.auction = b2.auction AND b1.bidder = b2.bidder WHERE b1.price > 990 AND b2.price < 5",
        3,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_by_limit() {
    let h = harness(4, 8_000);
    run_and_verify(
        &h,
        "SELECT auction, bidder, price, date_time FROM bid ORDER BY price DESC, date_time LIMIT 10",
        4,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tumbling_window_emits_before_the_end() {
    let h = harness(4, 20_000);
    let plan = run_and_verify(
        &h,
        "SELECT tumble(date_time, INTERVAL '10' SECOND) AS window_start, auction, count(*) AS n, max(price) AS top \
         FROM bid GROUP BY tumble(date_time, INTERVAL '10' SECOND), auction",
        8,
    )
    .await;
    assert!(
        plan.stages
            .iter()
            .any(|s| s.windows.iter().any(Option::is_some)),
        "{}",
        plan.explain()
    );
    let epochs = h.results.sink(&plan.query_code).epochs();
    assert!(
        epochs.iter().any(|e| *e < 7),
        "windows were only emitted at the end: {epochs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window() {
    let h = harness(4, 10_000);
    let plan = run_and_verify(
        &h,
        "SELECT window_start, auction, count(*) AS n FROM \
         (SELECT unnest(hop(date_time, INTERVAL '5' SECOND, INTERVAL '10' SECOND)) AS window_start, auction FROM bid) \
         GROUP BY window_start, auction",
        6,
    )
    .await;
    let epochs = h.results.sink(&plan.query_code).epochs();
    assert!(
        epochs.iter().any(|e| *e < 5),
        "windows were only emitted at the end: {epochs:?}"
    );
}

fn async_harness(group_size: usize, rows: usize) -> Harness {
    let mut h = harness(group_size, rows);
    h.options.invoke_async = true;
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicated_and_shuffled_deliveries_give_identical_results() {
    let h = async_harness(4, 10_000);
    h.runtime.set_faults(Faults {
        duplicate: true,
        max_delay_ms: 5,
        drop_payload: None,
        ..Default::default()
    });
    run_and_verify(
        &h,
        "SELECT auction, count(*) AS n, sum(price) AS s FROM bid GROUP BY auction",
        4,
    )
    .await;
    run_and_verify(
        &h,
        "SELECT tumble(date_time, INTERVAL '10' SECOND) AS w, channel, count(*) AS n FROM bid GROUP BY 1, 2",
        6,
    )
    .await;
    assert_eq!(h.runtime.stats().failed_async.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_payload_never_completes_silently() {
    let h = async_harness(4, 4_000);
    h.runtime.set_faults(Faults {
        duplicate: false,
        max_delay_ms: 0,
        drop_payload: Some(3),
        ..Default::default()
    });
    let sql = "SELECT auction, count(*) AS n FROM bid GROUP BY auction";
    let plan = plan_query(&h.ctx, sql, &h.options).await.unwrap();
    let err = run_local(&plan, &h.runtime, &h.options, 3, |_, _| {})
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("incomplete") && err.contains("misses"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_payloads_are_errors_and_the_runtime_keeps_serving() {
    let h = harness(4, 3_000);
    let sql = "SELECT auction, count(*) AS n FROM bid GROUP BY auction";
    let plan = plan_query(&h.ctx, sql, &h.options).await.unwrap();
    run_local(&plan, &h.runtime, &h.options, 2, |_, _| {})
        .await
        .unwrap();
    let group = plan.stages.iter().find(|s| s.members == 4).unwrap();
    let upstream = plan
        .stages
        .iter()
        .find(|s| s.consumer == Some(group.id))
        .unwrap();
    let member = function_name(&plan.query_code, group.id, 1);
    let good = |data: &str, seq_num: u32, schema_ok: bool| {
        let schema = if schema_ok {
            bid_schema()
        } else {
            auction_schema()
        };
        let _ = schema;
        serde_json::json!({
            "uuid": {"qid": plan.query_code, "seq_num": seq_num, "seq_len": upstream.members},
            "epoch": 1, "shuffle_id": upstream.id, "encoding": "zstd", "data": data,
        })
        .to_string()
        .into_bytes()
    };
    // A well-formed payload with one envelope field replaced.
    let with = |field: &str, value: serde_json::Value| {
        let mut v: serde_json::Value = serde_json::from_slice(&good("", 0, true)).unwrap();
        v[field] = value;
        serde_json::to_vec(&v).unwrap()
    };
    // A real zstd frame holding an Arrow stream of the wrong schema.
    let wrong = {
        let b = auctions(1).remove(0).remove(0);
        skein_engine::payload::encode_data(Encoding::Zstd, &b.schema(), &[b]).unwrap()
    };
    let cases = [
        (good("AAAA!!!", 0, true), "base64"),
        (
            good(&B64.encode(b"not a zstd frame at all"), 0, true),
            "Zstd",
        ),
        (good(&wrong, 0, true), "schema does not match"),
        (good("", 7, true), "seq_num 7"),
        (
            with("epoch", 99.into()),
            "epoch 99 is past the run's 2 epochs",
        ),
        (
            with(
                "uuid",
                serde_json::json!({"qid": "q0000000000", "seq_num": 0, "seq_len": upstream.members}),
            ),
            "not this function's query",
        ),
        (
            with(
                "uuid",
                serde_json::json!({"qid": plan.query_code, "seq_num": 0, "seq_len": u32::MAX}),
            ),
            "seq_len 4294967295 is not the",
        ),
        (
            with(
                "fragment",
                serde_json::json!({"index": 0, "count": u32::MAX}),
            ),
            "fragment count 4294967295",
        ),
        (
            with("shuffle_id", 77.into()),
            "shuffle id 77 is not an input",
        ),
        (b"{\"uuid\": ".to_vec(), "not valid JSON"),
    ];
    for (bytes, reason) in cases {
        let err = h
            .runtime
            .invoke(&member, bytes, InvocationType::Sync)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(reason), "want {reason:?} in {err}");
        if reason != "not valid JSON" {
            assert!(err.contains(&member) && err.contains("#0."), "{err}");
        }
    }
    // The same functions still run a whole query correctly.
    h.results.sink(&plan.query_code).clear();
    run_and_verify(
        &h,
        "SELECT auction, max(price) AS m FROM bid GROUP BY auction",
        2,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_over_four_kilobytes_is_spilled_and_read_back() {
    let h = harness(2, 3_000);
    // Hex strings compress poorly, so the plan stays large after zstd.
    let mut list: Vec<String> = (0..700u64)
        .map(|i| format!("'{:016x}'", i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
        .collect();
    list.push("'apple'".into());
    let sql = format!(
        "SELECT auction, price FROM bid WHERE channel IN ({}) AND bidder > 3",
        list.join(", ")
    );
    run_and_verify(&h, &sql, 2).await;
    let spilled: Vec<_> = h
        .runtime
        .store()
        .list(Some(&"skein/contexts".into()))
        .collect::<Vec<_>>()
        .await;
    assert!(!spilled.is_empty(), "no context was spilled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_functions_by_query_code_stage_and_member() {
    let h = harness(4, 100);
    let plan = plan_query(
        &h.ctx,
        "SELECT auction, count(*) FROM bid GROUP BY auction",
        &h.options,
    )
    .await
    .unwrap();
    let text = plan.explain();
    assert!(
        text.contains(&format!("{}-02-03", plan.query_code)),
        "{text}"
    );
    assert!(
        text.contains("hash exchange") && text.contains("FinalPartitioned"),
        "{text}"
    );
    let json = plan.explain_json();
    assert_eq!(json["functions"], 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windowed_join_of_raw_rows_with_a_window_aggregate() {
    // The NEXMark q7 shape: raw rows meet their window's maximum. The raw side
    // must wait in the join stage until the window closes.
    let h = harness(4, 20_000);
    let plan = run_and_verify(
        &h,
        "WITH w AS (SELECT tumble(date_time, INTERVAL '10' SECOND) AS window_start, auction, price FROM bid), \
         top AS (SELECT window_start, max(price) AS max_price FROM w GROUP BY window_start) \
         SELECT w.window_start, w.auction, w.price FROM w JOIN top t \
         ON w.window_start = t.window_start AND w.price = t.max_price",
        8,
    )
    .await;
    let epochs = h.results.sink(&plan.query_code).epochs();
    assert!(
        epochs.len() > 1,
        "windows were only emitted at the end: {epochs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_windows_close_when_the_gap_has_passed() {
    let h = harness(4, 40_000);
    let plan = run_and_verify(
        &h,
        "SELECT bidder, session_start, count(*) AS n, max(date_time) AS last_bid FROM ( \
           SELECT bidder, date_time, \
                  session(date_time, INTERVAL '2' SECOND) OVER (PARTITION BY bidder ORDER BY date_time) AS session_start \
           FROM bid WHERE price < 30) \
         GROUP BY bidder, session_start",
        8,
    )
    .await;
    let explained = plan.explain();
    assert!(
        explained.contains("session windows over column"),
        "{explained}"
    );
    let epochs = h.results.sink(&plan.query_code).epochs();
    assert!(
        epochs.len() > 1,
        "sessions were only emitted at the end: {epochs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constant_side_input_joins_the_stream() {
    let h = harness(4, 5_000);
    run_and_verify(
        &h,
        "SELECT s.label, count(*) AS n FROM bid b \
         JOIN (VALUES (1000, 'first'), (1001, 'second'), (1013, 'third')) AS s(id, label) ON b.auction = s.id \
         GROUP BY s.label",
        4,
    )
    .await;
}

/// Lambda recycles instances: a cold member takes its state from the
/// checkpoint store. Dropping warm instances at random between epochs
/// must not change a windowed join's or aggregate's rows.
/// Checkpoint `plan` every epoch under `root` of `store`, and recycle
/// each function instance with `probability` at every commit.
async fn checkpoint_and_recycle(
    h: &mut Harness,
    store: Arc<dyn ObjectStore>,
    root: &str,
    plan: &QueryPlan,
    probability: f64,
) {
    use skein_engine::checkpoint::CheckpointStore;
    use skein_engine::context::CheckpointSpec;
    let cs = CheckpointStore::open(store, root.into(), &plan.query_code)
        .await
        .unwrap();
    h.options.run = cs.manifest().run.clone();
    h.options.checkpoint = Some(CheckpointSpec { interval: 1 });
    h.runtime.set_checkpoints(Some(Arc::new(cs)));
    h.runtime.set_faults(Faults {
        recycle_probability: probability,
        ..Default::default()
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycled_members_resume_from_the_checkpoint() {
    let mut h = harness(4, 20_000);
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    for (i, sql) in [
        "SELECT tumble(date_time, INTERVAL '10' SECOND) AS w, auction, count(*) AS n, sum(price) AS s \
         FROM bid GROUP BY 1, 2",
        "SELECT b.auction, a.category, count(*) AS n FROM bid b JOIN auction a ON b.auction = a.id \
         GROUP BY 1, 2",
    ]
    .into_iter()
    .enumerate()
    {
        let plan = plan_query(&h.ctx, sql, &h.options).await.unwrap();
        checkpoint_and_recycle(&mut h, store.clone(), &format!("q{i}"), &plan, 0.5).await;
        let before = h.runtime.stats().cold_starts.load(Ordering::Relaxed);
        run_local(&plan, &h.runtime, &h.options, 12, |_, _| {})
            .await
            .unwrap_or_else(|e| panic!("run {sql}: {e}"));
        let cold = h.runtime.stats().cold_starts.load(Ordering::Relaxed) - before;
        let functions = plan.stages.iter().map(|s| s.members as u64).sum::<u64>();
        assert!(
            cold > 2 * functions,
            "{cold} cold starts for {functions} functions: instances were not recycled"
        );
        let got = h.results.sink(&plan.query_code).batches();
        let expected = single_process(&h.ctx, &plan).await.unwrap();
        let cmp = compare(&expected, &got, plan.ordered).unwrap();
        assert!(cmp.expected_rows > 0);
        assert!(cmp.equal, "{sql}\n{cmp:#?}\n{}", plan.explain());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_aggregates_held_for_open_windows_are_merged() {
    use skein_engine::compaction::Compactor;

    // 200 s of event time in 80 epochs: a 60 s window spans 24 epochs, and
    // its members receive two batches of partial rows per epoch.
    let sql = "SELECT tumble(date_time, INTERVAL '60' SECOND) AS w, auction, count(*) AS n, \
               sum(price) AS s, avg(price) AS a, min(bidder) AS lo, max(price) AS hi \
               FROM bid GROUP BY 1, 2";
    let mut h = harness(2, 20_000);
    let plan = run_and_verify(&h, sql, 80).await;
    let merged: usize = plan
        .stages
        .iter()
        .map(|s| Compactor::for_plan(&s.plan).len())
        .sum();
    assert_eq!(merged, 1, "one edge of partial rows:\n{}", plan.explain());
    // The same with checkpoints and instances recycled: a merge rewrites
    // the held rows, so the checkpoint after it is whole.
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    checkpoint_and_recycle(&mut h, store, "merged", &plan, 0.2).await;
    let plan = plan_query(&h.ctx, sql, &h.options).await.unwrap();
    run_local(&plan, &h.runtime, &h.options, 80, |_, _| {})
        .await
        .unwrap();
    let got =
        skein_engine::updating::in_query_order(&plan, h.results.sink(&plan.query_code).batches())
            .await
            .unwrap();
    let expected = single_process(&h.ctx, &plan).await.unwrap();
    let cmp = compare(&expected, &got, plan.ordered).unwrap();
    assert!(cmp.equal, "{cmp:#?}\n{}", plan.explain());
}
