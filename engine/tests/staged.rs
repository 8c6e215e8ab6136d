//! Multi-stage runs through the in-process runtime must give the same rows
//! as plain single-process DataFusion on the same input. Delivery faults
//! and recycled instances are in staged_faults.rs.

mod common;

use std::sync::Arc;

use common::*;
use futures::StreamExt;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use skein_engine::driver::run_local;
use skein_engine::planner::plan_query;
use skein_engine::verify::{compare, single_process};

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
        skein_engine::query::in_query_order(&plan, h.results.sink(&plan.query_code).batches())
            .await
            .unwrap();
    let expected = single_process(&h.ctx, &plan).await.unwrap();
    let cmp = compare(&expected, &got, plan.ordered).unwrap();
    assert!(cmp.equal, "{cmp:#?}\n{}", plan.explain());
}
