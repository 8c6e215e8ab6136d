//! Lookup joins against the real Redis: string values (`SET key value`, as
//! YSB's setup writes them) and hashes (several value columns), inner and
//! left joins with keys Redis does not have, the cache's TTL (a changed
//! value is seen once its cached answer expires, not before), and keys of
//! the wrong type or values of the wrong shape as clear errors.

mod common;

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use object_store::memory::InMemory;
use skein_engine::catalog::Catalog;
use skein_engine::clock::{Clock, ManualClock};
use skein_engine::driver::run_local;
use skein_engine::local::LocalRuntime;
use skein_engine::planner::{PlanOptions, plan_query, session};
use skein_engine::sink::CollectSinkFactory;
use skein_engine::source::{MemorySource, MemorySourceFactory};

fn events_schema(key: &DataType) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("ad_id", key.clone(), true),
        Field::new("n", DataType::Int64, false),
    ]))
}

/// (ad, ordinal) rows in one partition; with `epochs` epochs, epoch e reads
/// the e-th slice of them.
struct Run {
    catalog: Catalog,
    runtime: Arc<LocalRuntime>,
    results: CollectSinkFactory,
    /// The SQL type of the stream's `ad_id`.
    key_type: &'static str,
}

fn with_events(ads: &[Option<&str>]) -> Run {
    with_keys(Arc::new(StringArray::from(ads.to_vec())))
}

/// Events whose `ad_id` column is `keys` (of any type).
fn with_keys(keys: ArrayRef) -> Run {
    with_keys_on(keys, skein_engine::clock::system())
}

/// [`with_keys`], the lookup caches reading the time from `clock`.
fn with_keys_on(keys: ArrayRef, clock: Arc<dyn Clock>) -> Run {
    let key_type = match keys.data_type() {
        DataType::Utf8 => "VARCHAR",
        DataType::Int64 => "BIGINT",
        DataType::Int32 => "INT",
        DataType::Float64 => "DOUBLE",
        other => panic!("no SQL type for {other} here"),
    };
    let schema = events_schema(keys.data_type());
    let n = keys.len() as i64;
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![keys, Arc::new(Int64Array::from((0..n).collect::<Vec<_>>()))],
    )
    .unwrap();
    let memory = Arc::new(MemorySourceFactory::default());
    memory.insert("events", MemorySource::new(schema, vec![vec![batch]]));
    let mut catalog = Catalog::default();
    catalog.set_clock(clock);
    catalog.register_source("MEMORY", memory);
    let results = CollectSinkFactory::default();
    catalog.register_sink("COLLECT", Arc::new(results.clone()));
    skein_connectors::register(&mut catalog);
    let runtime = LocalRuntime::new(catalog.clone(), Arc::new(InMemory::new()));
    Run {
        catalog,
        runtime,
        results,
        key_type,
    }
}

/// Runs `query` over the events and a lookup table `t` declared with
/// `columns` and `options`; rows as text, ordered by `n`.
async fn run(
    r: &Run,
    columns: &str,
    options: &str,
    query: &str,
    epochs: u64,
    between_epochs: impl FnMut(u64, u64),
) -> Result<Vec<Vec<Option<String>>>, String> {
    let url = common::redis_url();
    let sql = format!(
        "CREATE EXTERNAL TABLE events (ad_id {}, n BIGINT NOT NULL) \
         STORED AS MEMORY LOCATION 'events';
         CREATE EXTERNAL TABLE t ({columns}) STORED AS REDIS LOCATION '{url}' \
         OPTIONS ('lookup.key' 'ad_id'{options});
         {query}",
        r.key_type
    );
    let options = PlanOptions {
        group_size: 2,
        ..Default::default()
    };
    let ctx = session(&r.catalog, options.group_size);
    let plan = plan_query(&ctx, &sql, &options)
        .await
        .map_err(|e| e.to_string())?;
    common::within(
        60,
        "lookup query",
        run_local(&plan, &r.runtime, &options, epochs, between_epochs),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut rows = vec![];
    for b in r.results.sink(&plan.query_code).batches() {
        let columns: Vec<ArrayRef> = b
            .columns()
            .iter()
            .map(|c| cast(c, &DataType::Utf8).unwrap())
            .collect();
        for i in 0..b.num_rows() {
            rows.push(
                columns
                    .iter()
                    .map(|c| {
                        c.is_valid(i)
                            .then(|| c.as_string::<i32>().value(i).to_string())
                    })
                    .collect::<Vec<_>>(),
            );
        }
    }
    rows.sort_by_key(|r| r[0].as_ref().and_then(|n| n.parse::<i64>().ok()));
    Ok(rows)
}

fn redis() -> redis::Connection {
    let url = common::require_redis();
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("Redis")
}

fn some(v: &[&str]) -> Vec<Option<String>> {
    v.iter().map(|s| Some(s.to_string())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_values_inner_and_left_join() {
    let mut con = redis();
    let p = common::unique_name("lookup-str");
    let (a1, a2, none) = (format!("{p}:a1"), format!("{p}:a2"), format!("{p}:none"));
    let _: () = redis::pipe()
        .set(&a1, "c1")
        .set(&a2, "c2")
        .query(&mut con)
        .unwrap();
    let r = with_events(&[Some(&a1), Some(&a2), Some(&a1), Some(&none), None]);
    let columns = "ad_id VARCHAR NOT NULL, campaign_id VARCHAR";
    let select = "SELECT e.n, c.campaign_id FROM events e";
    let on = "c ON e.ad_id = c.ad_id";
    let inner = run(
        &r,
        columns,
        "",
        &format!("{select} JOIN t {on}"),
        1,
        |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(
        inner,
        vec![some(&["0", "c1"]), some(&["1", "c2"]), some(&["2", "c1"])]
    );
    let left = run(
        &r,
        columns,
        "",
        &format!("{select} LEFT JOIN t {on}"),
        1,
        |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(left.len(), 5, "{left:?}");
    assert_eq!(left[3], vec![Some("3".to_string()), None], "no such key");
    assert_eq!(left[4], vec![Some("4".to_string()), None], "a NULL key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_values_are_typed_and_missing_fields_are_null() {
    let mut con = redis();
    let p = common::unique_name("lookup-hash");
    let (h1, h2, hx) = (format!("{p}:h1"), format!("{p}:h2"), format!("{p}:hx"));
    let _: () = redis::pipe()
        .hset_multiple(&h1, &[("campaign", "c9"), ("budget", "12")])
        .hset(&h2, "campaign", "c8")
        .query(&mut con)
        .unwrap();
    let r = with_events(&[Some(&h1), Some(&h2), Some(&hx)]);
    let rows = run(
        &r,
        "ad_id VARCHAR NOT NULL, campaign VARCHAR, budget BIGINT",
        "",
        "SELECT e.n, c.campaign, c.budget * 2 AS twice FROM events e LEFT JOIN t c ON e.ad_id = c.ad_id",
        1,
        |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            some(&["0", "c9", "24"]),
            vec![Some("1".into()), Some("c8".into()), None],
            vec![Some("2".into()), None, None],
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_value_is_seen_once_the_cache_ttl_expires() {
    let mut con = redis();
    let p = common::unique_name("lookup-ttl");
    let columns = "ad_id VARCHAR NOT NULL, campaign_id VARCHAR";
    let query = "SELECT e.n, c.campaign_id FROM events e JOIN t c ON e.ad_id = c.ad_id";
    // The cache reads a clock the test moves between the two epochs: at
    // the TTL the cached answer has expired, a millisecond short of it it
    // has not, however long the epochs take in real time.
    let ttl_ms = 200;
    for (advance_ms, second_sees) in [(ttl_ms, "new"), (ttl_ms - 1, "old")] {
        let key = format!("{p}:{advance_ms}");
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("old")
            .query(&mut con)
            .unwrap();
        // Two epochs, one row each, from the same function instance.
        let clock = Arc::new(ManualClock::new());
        let r = with_keys_on(
            Arc::new(StringArray::from(vec![Some(key.as_str()); 2])),
            clock.clone(),
        );
        let url = common::redis_url();
        let change = key.clone();
        let rows = run(
            &r,
            columns,
            &format!(", 'lookup.cache.ttl.ms' '{ttl_ms}'"),
            query,
            2,
            move |epoch, _| {
                if epoch == 0 {
                    let mut con = redis::Client::open(url.as_str())
                        .and_then(|c| c.get_connection())
                        .expect("Redis");
                    let _: () = redis::cmd("SET")
                        .arg(&change)
                        .arg("new")
                        .query(&mut con)
                        .unwrap();
                    clock.advance(Duration::from_millis(advance_ms));
                }
            },
        )
        .await
        .unwrap();
        assert_eq!(
            rows,
            vec![some(&["0", "old"]), some(&["1", second_sees])],
            "ttl {ttl_ms} ms, clock moved {advance_ms} ms"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_the_wrong_type_and_bad_values_are_clear_errors() {
    let mut con = redis();
    let p = common::unique_name("lookup-type");
    let (list, string, word) = (format!("{p}:list"), format!("{p}:str"), format!("{p}:word"));
    let _: () = redis::pipe()
        .rpush(&list, "x")
        .set(&string, "c1")
        .hset(&word, "budget", "lots")
        .query(&mut con)
        .unwrap();
    let query = "SELECT e.n, c.campaign_id FROM events e JOIN t c ON e.ad_id = c.ad_id";
    let budget = "SELECT e.n, c.budget FROM events e JOIN t c ON e.ad_id = c.ad_id";
    let one = "ad_id VARCHAR NOT NULL, campaign_id VARCHAR";
    let two = "ad_id VARCHAR NOT NULL, campaign_id VARCHAR, budget BIGINT";
    for (key, columns, query, says) in [
        (
            &list,
            one,
            query,
            format!("key \"{list}\" holds a list, and this table reads a string"),
        ),
        (
            &string,
            two,
            query,
            format!("key \"{string}\" holds a string, and this table reads a hash"),
        ),
        (&word, two, budget, "column budget is Int64".to_string()),
    ] {
        let r = with_events(&[Some(key)]);
        let err = run(&r, columns, "", query, 1, |_, _| {}).await.unwrap_err();
        assert!(err.contains(&says), "{key}: {err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
    // Bad options are refused when the table is declared.
    let r = with_events(&[]);
    for (options, says) in [
        (", 'lookup.cache.size' '-1'", "lookup.cache.size = \"-1\""),
        (", 'lookup.missing' 'skip'", "give 'join' or 'dead-letter'"),
        (", 'retry.timeout.ms' 'soon'", "retry.timeout.ms = \"soon\""),
        (
            ", 'layout' 'ysb'",
            "unknown option 'layout' for a REDIS lookup table",
        ),
        (
            ", 'lookup.prefix' 'c:'",
            "unknown option 'lookup.prefix' for a REDIS lookup table; it takes \
             lookup.cache.size, lookup.cache.ttl.ms, lookup.key, lookup.key.prefix, \
             lookup.missing, retry.timeout.ms",
        ),
    ] {
        let err = run(&r, one, options, query, 1, |_, _| {})
            .await
            .unwrap_err();
        assert!(err.contains(says), "{options}: {err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
}

/// Integers far from other tests' keys; Redis keys are their decimal text.
fn unique_ints(n: usize) -> Vec<i64> {
    let base = 9_000_000_000_000 + (rand::random::<u32>() as i64) * 1000;
    (0..n as i64).map(|i| base + i).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integer_keys_are_looked_up_as_their_decimal_text() {
    let mut con = redis();
    let ids = unique_ints(3);
    let _: () = redis::pipe()
        .set(ids[0].to_string(), "c0")
        .set(ids[1].to_string(), "c1")
        .query(&mut con)
        .unwrap();
    let keys: ArrayRef = Arc::new(Int64Array::from(vec![
        Some(ids[0]),
        Some(ids[1]),
        Some(ids[2]),
        None,
    ]));
    let query = "SELECT e.n, e.ad_id, c.ad_id, c.campaign_id FROM events e \
                 LEFT JOIN t c ON e.ad_id = c.ad_id";
    // The table's key declared as an integer, or as text the stream's
    // integers are compared with.
    for columns in [
        "ad_id BIGINT NOT NULL, campaign_id VARCHAR",
        "ad_id VARCHAR NOT NULL, campaign_id VARCHAR",
    ] {
        let r = with_keys(keys.clone());
        let rows = run(&r, columns, "", query, 1, |_, _| {}).await.unwrap();
        let id = |i: usize| Some(ids[i].to_string());
        assert_eq!(
            rows,
            vec![
                vec![Some("0".into()), id(0), id(0), Some("c0".into())],
                vec![Some("1".into()), id(1), id(1), Some("c1".into())],
                vec![Some("2".into()), id(2), None, None],
                vec![Some("3".into()), None, None, None],
            ],
            "{columns}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_cannot_be_redis_keys_are_planning_errors() {
    let query = "SELECT e.n, c.campaign_id FROM events e JOIN t c ON e.ad_id = c.ad_id";
    let float: ArrayRef = Arc::new(datafusion::arrow::array::Float64Array::from(vec![1.5]));
    // A floating-point stream column, or key column in the table.
    for (keys, columns) in [
        (float, "ad_id VARCHAR NOT NULL, campaign_id VARCHAR"),
        (
            Arc::new(StringArray::from(vec!["x"])) as ArrayRef,
            "ad_id DOUBLE NOT NULL, campaign_id VARCHAR",
        ),
    ] {
        let r = with_keys(keys);
        let err = run(&r, columns, "", query, 1, |_, _| {}).await.unwrap_err();
        assert!(
            err.contains("ad_id") && err.contains("Float64"),
            "{columns}: {err}"
        );
        assert!(!err.contains('\n'), "one line: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_prefix_goes_before_every_key_asked_for() {
    let mut con = redis();
    let p = common::unique_name("lookup-prefix");
    let ids = unique_ints(2);
    let _: () = redis::pipe()
        .set(format!("{p}:user:{}", ids[0]), "ann")
        // Without the prefix: not what the table asks for.
        .set(ids[1].to_string(), "bob")
        .query(&mut con)
        .unwrap();
    let r = with_keys(Arc::new(Int64Array::from(vec![ids[0], ids[1]])));
    let rows = run(
        &r,
        "ad_id BIGINT NOT NULL, name VARCHAR",
        &format!(", 'lookup.key.prefix' '{p}:user:'"),
        "SELECT e.n, c.ad_id, c.name FROM events e JOIN t c ON e.ad_id = c.ad_id",
        1,
        |_, _| {},
    )
    .await
    .unwrap();
    // The table's key column is the stream's key, without the prefix.
    assert_eq!(
        rows,
        vec![vec![
            Some("0".into()),
            Some(ids[0].to_string()),
            Some("ann".into())
        ]]
    );
}
