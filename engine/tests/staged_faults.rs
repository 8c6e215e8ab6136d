//! Multi-stage runs under faults: payloads delivered twice and out of
//! order, a payload lost, corrupt payloads, and warm instances recycled
//! between epochs. The harness is the one of staged.rs.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use common::*;
use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use skein_engine::context::function_name;
use skein_engine::driver::run_local;
use skein_engine::invoke::{InvocationType, Invoker};
use skein_engine::local::Faults;
use skein_engine::payload::Encoding;
use skein_engine::planner::plan_query;
use skein_engine::verify::{compare, single_process};

fn async_harness(group_size: usize, rows: usize) -> Harness {
    let mut h = harness(group_size, rows);
    h.options.invoke_async = true;
    h
}

/// (count, sum of price) per auction of `rows` bids, from the generated
/// bids themselves: no plan, no DataFusion.
fn count_and_sum_per_auction(rows: usize) -> BTreeMap<i64, (i64, i64)> {
    let mut out: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for b in bids(rows, 2).iter().flatten() {
        let auction = b.column(0).as_primitive::<Int64Type>();
        let price = b.column(2).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            let e = out.entry(auction.value(i)).or_default();
            e.0 += 1;
            e.1 += price.value(i);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicated_and_shuffled_deliveries_give_identical_results() {
    let rows = 10_000;
    let h = async_harness(4, rows);
    h.runtime.set_faults(Faults {
        duplicate: true,
        max_delay_ms: 5,
        drop_payload: None,
        ..Default::default()
    });
    let plan = run_and_verify(
        &h,
        "SELECT auction, count(*) AS n, sum(price) AS s FROM bid GROUP BY auction",
        4,
    )
    .await;
    let mut got: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for b in results(&h, &plan).await {
        let (a, n, s) = (
            b.column(0).as_primitive::<Int64Type>(),
            b.column(1).as_primitive::<Int64Type>(),
            b.column(2).as_primitive::<Int64Type>(),
        );
        for i in 0..b.num_rows() {
            assert!(
                got.insert(a.value(i), (n.value(i), s.value(i))).is_none(),
                "auction {} twice",
                a.value(i)
            );
        }
    }
    assert_eq!(got, count_and_sum_per_auction(rows), "against the bids");
    run_and_verify(
        &h,
        "SELECT tumble(date_time, INTERVAL '10' SECOND) AS w, channel, count(*) AS n FROM bid GROUP BY 1, 2",
        6,
    )
    .await;
    assert_eq!(h.runtime.stats().failed_async.load(Ordering::Relaxed), 0);
    // Every second copy was told apart from the first and dropped: as many
    // `duplicate` answers as copies injected, none for a first delivery.
    let stats = h.runtime.stats();
    let injected = stats.duplicates_injected.load(Ordering::Relaxed);
    let dropped = stats.duplicates_dropped.load(Ordering::Relaxed);
    assert!(injected > 0, "the fault delivered no payload twice");
    assert_eq!(dropped, injected, "duplicates dropped vs injected");
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

/// Lambda recycles instances: a cold member takes its state from the
/// checkpoint store. Dropping warm instances at random between epochs
/// must not change a windowed join's or aggregate's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycled_members_resume_from_the_checkpoint() {
    let mut h = harness(4, 20_000);
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let aggregate = |seconds: u32| {
        format!(
            "SELECT tumble(date_time, INTERVAL '{seconds}' SECOND) AS w, auction, count(*) AS n, \
             sum(price) AS s FROM bid GROUP BY 1, 2"
        )
    };
    // The aggregate again with one window over the whole input (200 s of
    // event time) and 40 epochs: its members merge the partial rows they
    // hold (every 32 held batches), and a recycled one restores them from
    // changes written before and after a merge.
    for (i, (sql, epochs)) in [
        (aggregate(10), 12),
        (
            "SELECT b.auction, a.category, count(*) AS n FROM bid b JOIN auction a ON b.auction = a.id \
             GROUP BY 1, 2"
                .to_string(),
            12,
        ),
        (aggregate(300), 40),
    ]
    .into_iter()
    .enumerate()
    {
        let plan = plan_query(&h.ctx, &sql, &h.options).await.unwrap();
        checkpoint_and_recycle(&mut h, store.clone(), &format!("q{i}"), &plan, 0.5).await;
        let before = h.runtime.stats().cold_starts.load(Ordering::Relaxed);
        run_local(&plan, &h.runtime, &h.options, epochs, |_, _| {})
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

/// A group rescaled after random commits (to random sizes within its key
/// groups, its instances recycled at random too) gives the rows the query
/// gives in one process: each new member takes its key groups' share of
/// every old member's state. Windowed and updating queries, aggregates
/// and a join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_rescaled_after_commits_give_the_same_rows() {
    use rand::{Rng, SeedableRng};
    use skein_engine::checkpoint::RescaleRequest;
    let seed: u64 = rand::random();
    eprintln!("rescale seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut h = harness(4, 20_000);
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    for (i, sql) in [
        "SELECT tumble(date_time, INTERVAL '10' SECOND) AS w, auction, count(*) AS n, \
         sum(price) AS s FROM bid GROUP BY 1, 2",
        "SELECT auction, max(price) AS m, count(*) AS n FROM bid GROUP BY auction",
        "SELECT b.auction, a.category, count(*) AS n FROM bid b JOIN auction a ON b.auction = a.id \
         GROUP BY 1, 2",
        "SELECT bidder, count(DISTINCT auction) AS auctions FROM bid GROUP BY bidder",
    ]
    .into_iter()
    .enumerate()
    {
        let plan = plan_query(&h.ctx, sql, &h.options).await.unwrap();
        checkpoint_and_recycle(&mut h, store.clone(), &format!("r{i}"), &plan, 0.2).await;
        let stages: Vec<u32> = plan
            .layout()
            .into_keys()
            .filter(|s| plan.check_rescale(*s, 1).is_ok())
            .collect();
        assert!(!stages.is_empty(), "no group of {sql} may change size");
        let cs = h.runtime.checkpoints().expect("a checkpoint store");
        let epochs = 14;
        let mut asked: BTreeMap<u32, u32> = BTreeMap::new();
        run_local(&plan, &h.runtime, &h.options, epochs, |epoch, _| {
            if epoch % 3 == 1 && epoch + 3 < epochs {
                let stage = stages[rng.random_range(0..stages.len())];
                let members = rng.random_range(1..=4);
                asked.insert(stage, members);
                let ask = RescaleRequest { stage, members };
                futures::executor::block_on(cs.ask_rescale(ask)).unwrap();
            }
        })
        .await
        .unwrap_or_else(|e| panic!("run {sql}: {e}"));
        let (_, layout) = cs.committed_in().await.unwrap().unwrap();
        for (stage, members) in &asked {
            assert_eq!(
                layout.get(stage),
                Some(members),
                "{sql}: stage {stage} {layout:?}"
            );
        }
        let got = results(&h, &plan).await;
        let expected = single_process(&h.ctx, &plan).await.unwrap();
        let cmp = compare(&expected, &got, plan.ordered).unwrap();
        assert!(cmp.expected_rows > 0);
        assert!(
            cmp.equal,
            "{sql} (seed {seed})\n{cmp:#?}\n{}",
            plan.explain()
        );
    }
}
