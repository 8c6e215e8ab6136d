//! Lookup joins in the staged planner, with an in-memory lookup: the join
//! lands in the source stage (no exchange for the table), survives the plan
//! codec, and keeps the rows its join type says.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use object_store::memory::InMemory;
use skein_engine::catalog::Catalog;
use skein_engine::driver::run_local;
use skein_engine::local::LocalRuntime;
use skein_engine::lookup::{Lookup, LookupFactory, LookupOptions, LookupRow};
use skein_engine::planner::{PlanOptions, QueryPlan, StageKind, plan_query, session};
use skein_engine::sink::CollectSinkFactory;
use skein_engine::source::{MemorySource, MemorySourceFactory, SourceConfig};

/// ad -> campaign, as a map.
#[derive(Debug)]
struct MapLookup(HashMap<String, String>);

#[async_trait]
impl Lookup for MapLookup {
    async fn get(&self, keys: &[String]) -> skein_engine::Result<Vec<Option<LookupRow>>> {
        Ok(keys
            .iter()
            .map(|k| self.0.get(k).map(|c| vec![Some(c.clone())]))
            .collect())
    }
}

struct MapFactory;

impl LookupFactory for MapFactory {
    fn options(&self) -> &'static [&'static str] {
        &[]
    }
    fn create(&self, _: &SourceConfig, _: &LookupOptions) -> skein_engine::Result<Arc<dyn Lookup>> {
        let map = (0..8)
            .map(|i| (format!("ad{i}"), format!("c{}", i % 3)))
            .collect();
        Ok(Arc::new(MapLookup(map)))
    }
}

fn events_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("ad_id", DataType::Utf8, false),
        Field::new("n", DataType::Int64, false),
    ]))
}

/// 100 events over ads ad0..ad9: ad8 and ad9 have no campaign.
fn events(parts: usize) -> Vec<Vec<RecordBatch>> {
    (0..parts)
        .map(|p| {
            let rows: Vec<usize> = (0..100).filter(|i| i % parts == p).collect();
            let ads: Vec<String> = rows.iter().map(|i| format!("ad{}", i % 10)).collect();
            let n: Vec<i64> = rows.iter().map(|i| *i as i64).collect();
            vec![
                RecordBatch::try_new(
                    events_schema(),
                    vec![
                        Arc::new(StringArray::from(ads)),
                        Arc::new(Int64Array::from(n)),
                    ],
                )
                .unwrap(),
            ]
        })
        .collect()
}

const DDL: &str = "CREATE EXTERNAL TABLE events (ad_id VARCHAR NOT NULL, n BIGINT NOT NULL) \
     STORED AS MEMORY LOCATION 'events';
     CREATE EXTERNAL TABLE campaigns (ad_id VARCHAR NOT NULL, campaign_id VARCHAR) \
     STORED AS MAP LOCATION 'm' OPTIONS ('lookup.key' 'ad_id');";

struct Harness {
    catalog: Catalog,
    runtime: Arc<LocalRuntime>,
    results: CollectSinkFactory,
    options: PlanOptions,
}

fn harness() -> Harness {
    let memory = Arc::new(MemorySourceFactory::default());
    memory.insert("events", MemorySource::new(events_schema(), events(2)));
    let mut catalog = Catalog::default();
    catalog.register_source("MEMORY", memory);
    catalog.register_lookup("MAP", Arc::new(MapFactory));
    let results = CollectSinkFactory::default();
    catalog.register_sink("COLLECT", Arc::new(results.clone()));
    let runtime = LocalRuntime::new(catalog.clone(), Arc::new(InMemory::new()));
    Harness {
        catalog,
        runtime,
        results,
        options: PlanOptions {
            group_size: 4,
            ..Default::default()
        },
    }
}

async fn plan(h: &Harness, query: &str) -> skein_engine::Result<QueryPlan> {
    let ctx = session(&h.catalog, h.options.group_size);
    plan_query(&ctx, &format!("{DDL}\n{query}"), &h.options).await
}

async fn run(h: &Harness, query: &str) -> (QueryPlan, Vec<RecordBatch>) {
    let plan = plan(h, query)
        .await
        .unwrap_or_else(|e| panic!("{query}: {e}"));
    run_local(&plan, &h.runtime, &h.options, 3, |_, _| {})
        .await
        .unwrap_or_else(|e| panic!("{query}: {e}\n{}", plan.explain()));
    let got = h.results.sink(&plan.query_code).batches();
    (plan, got)
}

/// VARCHAR columns are Utf8View; the checks read Utf8.
fn text(a: &ArrayRef) -> ArrayRef {
    cast(a, &DataType::Utf8).unwrap()
}

fn source_stage_holds_the_join(plan: &QueryPlan) {
    let explain = plan.explain();
    let with_join: Vec<_> = plan
        .stages
        .iter()
        .filter(|s| {
            datafusion::physical_plan::displayable(s.plan.as_ref())
                .indent(false)
                .to_string()
                .contains("LookupJoinExec")
        })
        .collect();
    assert_eq!(with_join.len(), 1, "{explain}");
    assert_eq!(with_join[0].kind, StageKind::Source, "{explain}");
    assert!(!explain.contains("LookupScanExec"), "{explain}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inner_join_counts_per_campaign_in_the_source_stage() {
    let h = harness();
    let (plan, got) = run(
        &h,
        "SELECT c.campaign_id, COUNT(*) AS views, SUM(e.n) AS total \
         FROM events e JOIN campaigns c ON e.ad_id = c.ad_id \
         GROUP BY c.campaign_id",
    )
    .await;
    source_stage_holds_the_join(&plan);
    // The aggregate's exchange comes after the join: two stages, no more.
    assert_eq!(plan.stages.len(), 2, "{}", plan.explain());
    let mut counts = HashMap::new();
    for b in &got {
        let c = text(b.column(0));
        let c = c.as_string::<i32>();
        let v = b
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        for i in 0..b.num_rows() {
            counts.insert(c.value(i).to_string(), v.value(i));
        }
    }
    // ads 0..7 map to c0 (0,3,6), c1 (1,4,7), c2 (2,5); 10 events each.
    let want: HashMap<String, i64> = [
        ("c0".to_string(), 30),
        ("c1".to_string(), 30),
        ("c2".to_string(), 20),
    ]
    .into();
    assert_eq!(counts, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn left_join_keeps_rows_without_a_match_with_nulls() {
    let h = harness();
    // The table on the left side of the SQL, the stream on the right.
    let (plan, got) = run(
        &h,
        "SELECT e.ad_id, c.campaign_id, c.ad_id AS looked_up \
         FROM events e LEFT JOIN campaigns c ON e.ad_id = c.ad_id",
    )
    .await;
    source_stage_holds_the_join(&plan);
    let rows: usize = got.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 100);
    let mut nulls = 0;
    for b in &got {
        let (ad, looked_up) = (text(b.column(0)), text(b.column(2)));
        let (ad, looked_up) = (ad.as_string::<i32>(), looked_up.as_string::<i32>());
        let campaign = b.column(1);
        for i in 0..b.num_rows() {
            let missing = ad.value(i) == "ad8" || ad.value(i) == "ad9";
            assert_eq!(campaign.is_null(i), missing, "{}", ad.value(i));
            assert_eq!(looked_up.is_null(i), missing);
            if !missing {
                assert_eq!(looked_up.value(i), ad.value(i));
            }
            nulls += usize::from(missing);
        }
    }
    assert_eq!(nulls, 20);
    let (_, got) = run(
        &h,
        "SELECT c.campaign_id, e.n FROM campaigns c JOIN events e ON c.ad_id = e.ad_id",
    )
    .await;
    assert_eq!(got.iter().map(|b| b.num_rows()).sum::<usize>(), 80);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_table_used_otherwise_is_a_planning_error() {
    let h = harness();
    for (query, says) in [
        (
            "SELECT * FROM campaigns",
            "can only be joined with a stream",
        ),
        (
            "SELECT * FROM events e FULL JOIN campaigns c ON e.ad_id = c.ad_id",
            "not supported",
        ),
        (
            "SELECT * FROM events e JOIN campaigns c ON e.ad_id = c.campaign_id",
            "join on its key column ad_id",
        ),
    ] {
        let err = plan(&h, query).await.unwrap_err().to_string();
        assert!(err.contains(says), "{query}: {err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
    // 'lookup.missing' 'dead-letter' needs the stream's dead-letter destination.
    let ctx = session(&h.catalog, 4);
    let sql = DDL.replace(
        "('lookup.key' 'ad_id')",
        "('lookup.key' 'ad_id', 'lookup.missing' 'dead-letter')",
    ) + "SELECT * FROM events e JOIN campaigns c ON e.ad_id = c.ad_id";
    let err = plan_query(&ctx, &sql, &h.options)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("declares none"), "{err}");
}
