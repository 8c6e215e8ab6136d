//! The windowed count and sum per key the durable-state tests run: the
//! input records, the reference result computed here (outside the engine),
//! and the check that what a sink holds equals it.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::rows::{int, millis, text};

pub const BASE_MS: i64 = 1_700_000_000_000;
pub const KEYS: usize = 50;
pub const WINDOW_MS: i64 = 10_000;

/// (window start, key) -> (count, sum).
pub type Reference = BTreeMap<(i64, String), (i64, i64)>;

/// `n` records `{"k", "v", "ts"}` over `span_ms` of event time as
/// (partition, JSON), in event-time order within each of `partitions`
/// partitions, and the reference result.
pub fn records(n: usize, partitions: usize, span_ms: i64) -> (Vec<(usize, String)>, Reference) {
    let mut reference = Reference::new();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let ts = BASE_MS + (i as i64 * span_ms) / n as i64;
        let k = format!("k{}", (i * 7) % KEYS);
        let v = i as i64;
        out.push((
            i % partitions,
            format!(r#"{{"k":"{k}","v":{v},"ts":{ts}}}"#),
        ));
        let w = ts - ts.rem_euclid(WINDOW_MS);
        let e = reference.entry((w, k)).or_default();
        e.0 += 1;
        e.1 += v;
    }
    (out, reference)
}

/// The query: `ev` (a source DDL) into `out` (a sink DDL).
pub fn query(source: &str, sink: &str) -> String {
    query_counting(source, sink, "count(*)")
}

/// [`query`] with `count` as the count: `count(DISTINCT v)` gives the same
/// numbers (every record's `v` differs) but sources cannot pre-aggregate
/// it, so the group does the work.
pub fn query_counting(source: &str, sink: &str, count: &str) -> String {
    format!(
        "{source}\n{sink}\n\
         INSERT INTO out SELECT tumble(ts, INTERVAL '10' SECOND) AS w, k, {count} AS n, \
           sum(v) AS s FROM ev GROUP BY tumble(ts, INTERVAL '10' SECOND), k;\n"
    )
}

/// Sliding windows of `size_ms` every `slide_ms` (each record in
/// `size_ms / slide_ms` of them) per key: `count` and sum(v) into Redis
/// lists `<prefix>|<window start>|<k>`, as [`redis_list_sink`] keeps them.
pub fn hop_into_redis_lists(
    source: &str,
    url: &str,
    prefix: &str,
    count: &str,
    slide_ms: i64,
    size_ms: i64,
) -> String {
    format!(
        "{source}\n\
         CREATE EXTERNAL TABLE out (window_start TIMESTAMP, k VARCHAR, n BIGINT, s BIGINT) \
           STORED AS REDIS LOCATION '{url}' \
           OPTIONS ('layout' 'list', 'key' '{prefix}|{{window_start}}|{{k}}', 'value' 'n');\n\
         INSERT INTO out WITH h AS (\
           SELECT unnest(hop(ts, INTERVAL '{slide_ms}' MILLISECOND, INTERVAL '{size_ms}' MILLISECOND)) \
             AS window_start, k, v FROM ev) \
         SELECT window_start, k, {count} AS n, sum(v) AS s FROM h GROUP BY window_start, k;\n"
    )
}

/// The reference of [`hop_into_redis_lists`] over `records`.
pub fn hop_reference(records: &[(usize, String)], slide_ms: i64, size_ms: i64) -> Reference {
    let mut reference = Reference::new();
    for (_, json) in records {
        let r: Value = serde_json::from_str(json).expect("a record");
        let (k, v, ts) = (
            r["k"].as_str().expect("k"),
            r["v"].as_i64().expect("v"),
            r["ts"].as_i64().expect("ts"),
        );
        for w in super::event_time::hop_starts(ts, slide_ms, size_ms) {
            let e = reference.entry((w, k.to_string())).or_default();
            e.0 += 1;
            e.1 += v;
        }
    }
    reference
}

/// The rows written equal the reference: none missing, doubled or wrong.
pub fn assert_exact(rows: &[Map<String, Value>], reference: &Reference, what: &str) {
    let mut got = Reference::new();
    let mut doubled = vec![];
    for row in rows {
        let key = (millis(row, "w"), text(row, "k"));
        if got
            .insert(key.clone(), (int(row, "n"), int(row, "s")))
            .is_some()
        {
            doubled.push(key);
        }
    }
    assert!(
        doubled.is_empty(),
        "{what}: windows written twice: {doubled:?}"
    );
    let missing: Vec<_> = reference.keys().filter(|k| !got.contains_key(*k)).collect();
    let wrong: Vec<_> = got
        .iter()
        .filter(|(k, v)| reference.get(*k) != Some(v))
        .collect();
    assert!(
        missing.is_empty() && wrong.is_empty(),
        "{what}: {} of {} windows missing, first {:?}; {} wrong, first {:?}",
        missing.len(),
        reference.len(),
        missing.first(),
        wrong.len(),
        wrong.first()
    );
}

/// A fresh topic of `partitions` partitions holding the records; returns
/// the table `ev` reading it, `pull` records per partition and epoch.
pub fn kafka_table(records: &[(usize, String)], partitions: usize, pull: usize) -> String {
    let (topic, ddl) = empty_kafka_table(partitions, pull);
    produce(&topic, records);
    ddl
}

/// A fresh, empty topic of `partitions` partitions: (topic, the table `ev`
/// reading it, `pull` records a pull).
///
/// Tests produce into it while a query runs, often after it has been quiet
/// for longer than the default idle timeout (10 s). The partitions whose
/// records land first would then close windows that a partition still
/// counted idle has rows for, a moment later: late rows, as documented
/// (docs/sources.md, idle partitions), not what these tests check. So no
/// partition goes idle here while the query runs.
pub fn empty_kafka_table(partitions: usize, pull: usize) -> (String, String) {
    let brokers = super::require_kafka();
    let name = super::unique_name("durable");
    super::kafka::create_topic(&brokers, &name, partitions as i32);
    let ddl = format!(
        "CREATE EXTERNAL TABLE ev (k VARCHAR, v BIGINT, ts TIMESTAMP) STORED AS KAFKA \
           LOCATION '{name}' OPTIONS ('bootstrap.servers' '{brokers}', 'format' 'json', \
           'event_time' 'ts', 'max.records.per.pull' '{pull}', 'idle.timeout' '1h');"
    );
    (name, ddl)
}

/// Appends the records (partition, JSON) to `topic`, in order.
pub fn produce(topic: &str, records: &[(usize, String)]) {
    let writer = super::kafka::PartitionWriter::new(&super::kafka_brokers(), topic);
    for (p, json) in records {
        writer.send(*p as i32, json);
    }
    writer.flush();
}

/// A fresh 2-partition topic and the Kafka table `out` writing to it.
pub fn kafka_sink() -> (String, String) {
    let brokers = super::kafka_brokers();
    let out = super::unique_name("durable-out");
    super::kafka::create_topic(&brokers, &out, 2);
    let ddl = format!(
        "CREATE EXTERNAL TABLE out (w TIMESTAMP, k VARCHAR, n BIGINT, s BIGINT) STORED AS KAFKA \
           LOCATION '{out}' OPTIONS ('bootstrap.servers' '{brokers}', 'format' 'json');"
    );
    (out, ddl)
}

/// The files table `out` writing JSON files into `dir`.
pub fn files_sink(dir: &std::path::Path) -> String {
    format!(
        "CREATE EXTERNAL TABLE out (w TIMESTAMP, k VARCHAR, n BIGINT, s BIGINT) STORED AS \
           FILES LOCATION 'file://{}' OPTIONS ('format' 'json');",
        dir.display()
    )
}

/// The rows of the committed records of `topic` (read_committed).
pub fn kafka_rows(topic: &str) -> Vec<Map<String, Value>> {
    super::kafka::committed_records(&super::kafka_brokers(), topic)
        .into_iter()
        .map(|(_, _, value)| serde_json::from_slice(&value).expect("a JSON row"))
        .collect()
}

/// The Redis table `out` writing a hash per window and key under `prefix`.
pub fn redis_sink(url: &str, prefix: &str) -> String {
    format!(
        "CREATE EXTERNAL TABLE out (w TIMESTAMP, k VARCHAR, n BIGINT, s BIGINT) STORED AS REDIS \
           LOCATION '{url}' OPTIONS ('layout' 'hash', 'key' '{prefix}|{{w}}|{{k}}');"
    )
}

/// A connection to `url` and the keys under `prefix|`.
pub fn keys_under(url: &str, prefix: &str) -> (redis::Connection, Vec<String>) {
    super::redis_keys(url, &format!("{prefix}|*"))
}

/// The Redis table `out` pushing each row's count `n` onto a list per
/// window and key under `prefix`: every write adds an element, so a write
/// that lands twice shows as a list of two (a hash would be overwritten in
/// place and hide it).
pub fn redis_list_sink(url: &str, prefix: &str) -> String {
    format!(
        "CREATE EXTERNAL TABLE out (w TIMESTAMP, k VARCHAR, n BIGINT, s BIGINT) STORED AS REDIS \
           LOCATION '{url}' OPTIONS ('layout' 'list', 'key' '{prefix}|{{w}}|{{k}}', 'value' 'n');"
    )
}

/// What [`redis_list_sink`] holds equals the reference's counts: one list
/// of one element per (window, key), none missing, doubled or extra. Keys
/// `k` in `skip` (rows a test adds to close windows) are left out.
pub fn assert_lists_exact(url: &str, prefix: &str, reference: &Reference, skip: &[&str]) {
    let (mut con, keys) = keys_under(url, prefix);
    let mut doubled = vec![];
    let mut got = BTreeMap::new();
    for key in &keys {
        let items: Vec<i64> = redis::cmd("LRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query(&mut con)
            .unwrap();
        if items.len() != 1 {
            doubled.push((key.clone(), items.clone()));
        }
        let mut parts = key.splitn(3, '|').skip(1);
        let w = parts.next().and_then(super::rows::parse_timestamp);
        let k = parts.next().unwrap_or_default().to_string();
        if skip.contains(&k.as_str()) {
            continue;
        }
        got.insert((w.expect("a window start in the key"), k), items[0]);
    }
    assert!(doubled.is_empty(), "written more than once: {doubled:?}");
    assert!(!reference.is_empty(), "a reference with rows");
    let wrong: Vec<_> = reference
        .iter()
        .filter(|(k, (n, _))| got.get(*k) != Some(n))
        .map(|(k, (n, _))| (k.clone(), *n, got.get(k).copied()))
        .take(10)
        .collect();
    assert!(
        wrong.is_empty(),
        "(window, key, want, got), first 10: {wrong:?}"
    );
    assert_eq!(
        got.len(),
        reference.len(),
        "no (window, key) beyond the reference"
    );
}

/// The rows [`redis_sink`] wrote under `prefix`.
pub fn redis_rows(url: &str, prefix: &str) -> Vec<Map<String, Value>> {
    let (mut con, keys) = keys_under(url, prefix);
    keys.iter()
        .map(|key| {
            let fields: BTreeMap<String, i64> =
                redis::cmd("HGETALL").arg(key).query(&mut con).unwrap();
            let mut parts = key.splitn(3, '|').skip(1);
            let mut row = Map::new();
            row.insert("w".into(), parts.next().unwrap_or_default().into());
            row.insert("k".into(), parts.next().unwrap_or_default().into());
            for (f, v) in fields {
                row.insert(f, v.into());
            }
            row
        })
        .collect()
}

/// key -> (count, sum) of the records.
pub fn totals(records: &[(usize, String)]) -> BTreeMap<String, (i64, i64)> {
    let mut out: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for (_, json) in records {
        let v: Value = serde_json::from_str(json).expect("a record");
        let e = out
            .entry(v["k"].as_str().expect("k").to_string())
            .or_default();
        e.0 += 1;
        e.1 += v["v"].as_i64().expect("v");
    }
    out
}

/// An aggregate without a window over `ev`: per key, `count` and sum(v),
/// into Redis hashes `<prefix>:<k>`.
pub fn per_key_into_redis(source: &str, prefix: &str, count: &str) -> String {
    let sink = format!(
        "CREATE EXTERNAL TABLE out (k VARCHAR, n BIGINT, total BIGINT) STORED AS REDIS \
         LOCATION '{}' OPTIONS ('layout' 'hash', 'key' '{prefix}:{{k}}');",
        super::redis_url()
    );
    format!(
        "{source}\n{sink}\nINSERT INTO out SELECT k, {count} AS n, sum(v) AS total FROM ev \
         GROUP BY k;\n"
    )
}
