//! The staged-run tests' harness: deterministic bids and auctions in
//! memory sources, the in-process runtime, and a check against plain
//! single-process DataFusion on the same input.

#![allow(dead_code)]

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, StringArray, TimestampMillisecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use skein_engine::catalog::Catalog;
use skein_engine::driver::run_local;
use skein_engine::exec::SourceTable;
use skein_engine::local::{Faults, LocalRuntime};
use skein_engine::planner::{PlanOptions, QueryPlan, plan_query, session};
use skein_engine::sink::CollectSinkFactory;
use skein_engine::source::{MemorySource, MemorySourceFactory, SourceConfig};
use skein_engine::verify::{compare, single_process};

pub fn bid_schema() -> SchemaRef {
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

pub fn auction_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("category", DataType::Int64, false),
        Field::new("seller", DataType::Int64, false),
    ]))
}

/// Deterministic pseudo-random bids, event time increasing 10 ms a row,
/// spread over `parts` partitions round-robin (each in time order).
pub fn bids(rows: usize, parts: usize) -> Vec<Vec<RecordBatch>> {
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

pub fn auctions(parts: usize) -> Vec<Vec<RecordBatch>> {
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

pub struct Harness {
    pub ctx: SessionContext,
    pub runtime: Arc<LocalRuntime>,
    pub results: CollectSinkFactory,
    pub options: PlanOptions,
}

pub fn harness(group_size: usize, rows: usize) -> Harness {
    let memory = Arc::new(MemorySourceFactory::default());
    memory.insert("bid", MemorySource::new(bid_schema(), bids(rows, 2)));
    memory.insert("auction", MemorySource::new(auction_schema(), auctions(2)));
    let mut catalog = Catalog::default();
    catalog.register_source("MEMORY", memory.clone());
    let results = CollectSinkFactory::default();
    catalog.register_sink("COLLECT", Arc::new(results.clone()));
    let ctx = session(&catalog, group_size);
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
        let source = catalog.create_source(&config, schema).unwrap();
        ctx.register_table(name, Arc::new(SourceTable::new(name, config, source)))
            .unwrap();
    }
    let runtime = LocalRuntime::new(catalog, Arc::new(InMemory::new()));
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

pub async fn run_and_verify(h: &Harness, sql: &str, epochs: u64) -> QueryPlan {
    let plan = plan_query(&h.ctx, sql, &h.options)
        .await
        .unwrap_or_else(|e| panic!("plan {sql}: {e}"));
    run_local(&plan, &h.runtime, &h.options, epochs, |_, _| {})
        .await
        .unwrap_or_else(|e| panic!("run {sql}: {e}\n{}", plan.explain()));
    let got = results(h, &plan).await;
    let expected = single_process(&h.ctx, &plan).await.unwrap();
    let cmp = compare(&expected, &got, plan.ordered).unwrap();
    assert!(
        cmp.expected_rows > 0,
        "query returns no rows, which proves little: {sql}"
    );
    assert!(cmp.equal, "{sql}\n{:#?}\n{}", cmp, plan.explain());
    plan
}

/// The rows `plan` wrote, in the query's order (an updating query's last
/// value of each row).
pub async fn results(h: &Harness, plan: &QueryPlan) -> Vec<RecordBatch> {
    skein_engine::query::in_query_order(plan, h.results.sink(&plan.query_code).batches())
        .await
        .unwrap()
}

/// Checkpoint `plan` every epoch under `root` of `store`, and recycle
/// each function instance with `probability` at every commit.
pub async fn checkpoint_and_recycle(
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
