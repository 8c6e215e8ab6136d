//! Updating queries on a live stream (an aggregate without a window): the
//! result is in the sink while the query runs, at most two epochs behind
//! its records, and stays exact through SIGKILLs and restarts; each sink
//! that takes updates holds what its reader expects (Redis hashes upserted
//! and deleted by key, a Kafka topic of upserts and tombstones read
//! read_committed keeping the last value per key, a Kafka topic of
//! Debezium change events replayed into the table);
//! a sink that only appends refuses the query when it is planned.
//!
//! Counts and sums per key come from a reference computed here; a record
//! the engine took twice, or a replayed write applied twice to the state,
//! shows as a count one too high.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::kafka::{PartitionWriter, committed_records, create_topic};
use common::kills::{committed_epoch, wait_for_commit};
use common::redis_counts;
use serde_json::Value;
use skein::report::Report;
use skein_engine::epochs::Stopped;

const KEYS: usize = 10;
const PARTITIONS: usize = 2;

/// Record `i`: `{"k", "v", "ts"}` for partition `i % 2`.
fn record(i: usize) -> (usize, String, String, i64) {
    let k = format!("k{}", (i * 7) % KEYS);
    let v = (i as i64 * 31) % 1000;
    let json = format!(
        r#"{{"k":"{k}","v":{v},"ts":{}}}"#,
        1_700_000_000_000i64 + i as i64 * 10
    );
    (i % PARTITIONS, json, k, v)
}

/// key -> (count, sum) over records `0..n`.
fn reference(n: usize) -> BTreeMap<String, (i64, i64)> {
    let mut out: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for i in 0..n {
        let (_, _, k, v) = record(i);
        let e = out.entry(k).or_default();
        e.0 += 1;
        e.1 += v;
    }
    out
}

fn produce(writer: &PartitionWriter, range: std::ops::Range<usize>) {
    for i in range {
        let (p, json, _, _) = record(i);
        writer.send(p as i32, &json);
    }
    writer.flush();
}

struct Live {
    dir: PathBuf,
    topic: String,
    writer: PartitionWriter,
}

impl Live {
    fn new(name: &str) -> Self {
        let brokers = common::require_kafka();
        let topic = common::unique_name(name);
        create_topic(&brokers, &topic, PARTITIONS as i32);
        let dir = std::env::temp_dir().join(common::unique_name(name));
        std::fs::create_dir_all(&dir).expect("a working directory");
        Live {
            writer: PartitionWriter::new(&brokers, &topic),
            dir,
            topic,
        }
    }

    fn source(&self) -> String {
        format!(
            "CREATE EXTERNAL TABLE src (k VARCHAR, v BIGINT, ts TIMESTAMP) STORED AS KAFKA \
             LOCATION '{}' OPTIONS ('bootstrap.servers' '{}', 'format' 'json');\n",
            self.topic,
            common::kafka_brokers()
        )
    }

    fn write_query(&self, sink: &str) -> PathBuf {
        let sql = self.dir.join("q.sql");
        std::fs::write(
            &sql,
            format!(
                "{}{sink}\nINSERT INTO out SELECT k, count(*) AS n, sum(v) AS total FROM src \
                 GROUP BY k;\n",
                self.source()
            ),
        )
        .expect("writing the query");
        sql
    }

    fn checkpoints(&self) -> PathBuf {
        self.dir.join("checkpoints")
    }

    fn command(&self, sql: &Path, bound: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_skein"));
        c.args(["run", sql.to_str().expect("utf-8 path"), "--json"])
            .args(bound)
            .args([
                "--checkpoint-dir",
                self.checkpoints().to_str().expect("utf-8"),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }
}

impl Live {
    /// A standing run of `sql` (an epoch every 50 ms, a commit each) whose
    /// members keep at most 1 KiB of groups in memory.
    fn spawn_in_1kib(&self, sql: &Path, extra: &[&str]) -> Child {
        let standing = [
            "--interval",
            "50ms",
            "--checkpoint-interval",
            "1",
            "--state-memory",
            "1KiB",
        ];
        let mut c = self.command(sql, &standing);
        c.args(extra).spawn().expect("starting skein")
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until the query has committed `n` epochs past its last commit.
fn wait_for_epochs(child: &mut Child, checkpoints: &Path, n: u64) {
    let c0 = committed_epoch(checkpoints).expect("a commit");
    wait_for_commit(child, checkpoints, c0 + n);
}

/// SIGKILL `child` and reap it.
fn sigkill(child: &mut Child) {
    child.kill().expect("SIGKILL");
    child.wait().expect("reaping skein");
}

/// A Redis table `out (k, n, total)`, a hash per key under `prefix:`.
fn redis_hashes(prefix: &str) -> String {
    format!(
        "CREATE EXTERNAL TABLE out (k VARCHAR, n BIGINT, total BIGINT) STORED AS REDIS \
         LOCATION '{}' OPTIONS ('layout' 'hash', 'key' '{prefix}:{{k}}');",
        common::redis_url()
    )
}

#[test]
fn an_aggregate_without_a_window_is_in_redis_within_two_epochs_and_exact_through_kills() {
    common::require_redis();
    let live = Live::new("updating-redis");
    let prefix = common::unique_name("upd");
    let sql = live.write_query(&redis_hashes(&prefix));
    // A commit every epoch: the commits are the test's clock.
    let standing = ["--interval", "100ms", "--checkpoint-interval", "1"];
    let checkpoints = live.checkpoints();
    let mut child = live
        .command(&sql, &standing)
        .spawn()
        .expect("starting skein");
    // Running, before any record exists.
    wait_for_commit(&mut child, &checkpoints, 1);
    let mut produced = 0;
    // Each batch of records shows within two epochs of being written: the
    // epoch in flight may have pulled before they were there, the next
    // cannot have.
    let check_within_two_epochs = |child: &mut Child, produced: usize, what: &str| {
        let c0 = committed_epoch(&checkpoints).expect("a commit");
        wait_for_commit(child, &checkpoints, c0 + 2);
        assert_eq!(
            redis_counts(&prefix),
            reference(produced),
            "{what}: Redis two epochs after {produced} records"
        );
    };
    for step in [4_000, 4_000] {
        produce(&live.writer, produced..produced + step);
        produced += step;
        check_within_two_epochs(&mut child, produced, "running");
    }
    // SIGKILL ten times, each after the run has committed new epochs since
    // it started, with records arriving all along.
    let mut kills = 0;
    while kills < 10 {
        let started_at = committed_epoch(&checkpoints).expect("a commit");
        produce(&live.writer, produced..produced + 1_000);
        produced += 1_000;
        wait_for_commit(&mut child, &checkpoints, started_at + 1 + kills as u64 % 3);
        assert!(
            child.try_wait().expect("waiting for skein").is_none(),
            "the run was alive when killed"
        );
        child.kill().expect("SIGKILL");
        child.wait().expect("reaping skein");
        kills += 1;
        child = live
            .command(&sql, &standing)
            .spawn()
            .expect("restarting skein");
    }
    produce(&live.writer, produced..20_000);
    produced = 20_000;
    check_within_two_epochs(&mut child, produced, "after 10 kills");
    let out = stop_with_sigterm(child);
    let report = common::run_report(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(report.stopped, Stopped::Signal, "{report:?}");
    assert!(
        report.resumed_after.is_some(),
        "the last run resumed: {report:?}"
    );
    assert_eq!(redis_counts(&prefix), reference(produced), "at the end");
}

/// Stops a standing run with SIGTERM; it exits cleanly.
fn stop_with_sigterm(child: Child) -> std::process::Output {
    let sent = Command::new("kill")
        .args(["-s", "TERM", &child.id().to_string()])
        .status()
        .expect("running kill");
    assert!(sent.success());
    let out = common::wait_with_timeout(child, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs the query to the end of the topic through `kills` SIGKILLs, each
/// landed; the later ones cut a run after its commit, and the last run
/// resumed after the last commit.
fn drain_through_kills(live: &Live, sql: &Path, kills: usize) -> Report {
    let run = common::kills::run_through_kills(
        || live.command(sql, &["--until-drained", "--interval", "10ms"]),
        &live.checkpoints(),
        kills,
    );
    let late = kills - kills.div_ceil(3);
    assert!(
        run.mid_run() >= late,
        "{} kills cut a run after a commit, {late} planned: {:?}",
        run.mid_run(),
        run.kills
    );
    run.assert_resumed()
}

#[test]
fn a_kafka_upsert_topic_read_committed_keeps_each_keys_latest_row() {
    let live = Live::new("updating-upsert");
    let out = common::unique_name("updating-upsert-out");
    create_topic(&common::kafka_brokers(), &out, 2);
    produce(&live.writer, 0..6_000);
    let sql = live.write_query(&format!(
        "CREATE EXTERNAL TABLE out (k VARCHAR, n BIGINT, total BIGINT) STORED AS KAFKA \
         LOCATION '{out}' OPTIONS ('bootstrap.servers' '{}', 'key' 'k');",
        common::kafka_brokers()
    ));
    let std::ops::RangeTo { end } = ..6_000;
    let sql_small = live.dir.join("small.sql");
    std::fs::write(
        &sql_small,
        std::fs::read_to_string(&sql).unwrap().replace(
            "'format' 'json');",
            "'format' 'json', 'max.records.per.pull' '300');",
        ),
    )
    .unwrap();
    drain_through_kills(&live, &sql_small, 3);
    let mut latest: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let records = committed_records(&common::kafka_brokers(), &out);
    assert!(
        records.len() > KEYS,
        "an update per epoch, not one row per key at the end"
    );
    for (_, key, value) in records {
        let key = String::from_utf8(key.expect("a keyed message")).unwrap();
        if value.is_empty() {
            latest.remove(&key);
            continue;
        }
        let v: Value = serde_json::from_slice(&value).unwrap();
        assert_eq!(v["k"], key.as_str());
        latest.insert(
            key,
            (v["n"].as_i64().unwrap(), v["total"].as_i64().unwrap()),
        );
    }
    assert_eq!(latest, reference(end));
}

/// A standing count and sum per key into a Kafka topic of Debezium change
/// events, over 5,000 records already in the source topic; returns the
/// query file and the output topic.
fn debezium_query(live: &Live) -> (PathBuf, String) {
    let out = common::unique_name("updating-debezium-out");
    create_topic(&common::kafka_brokers(), &out, 1);
    produce(&live.writer, 0..5_000);
    let sql = live.dir.join("q.sql");
    std::fs::write(
        &sql,
        format!(
            "CREATE EXTERNAL TABLE src (k VARCHAR, v BIGINT, ts TIMESTAMP) STORED AS KAFKA \
             LOCATION '{}' OPTIONS ('bootstrap.servers' '{}', 'format' 'json', \
             'max.records.per.pull' '200');\n\
             CREATE EXTERNAL TABLE out (k VARCHAR, n BIGINT, total BIGINT) STORED AS KAFKA \
             LOCATION '{out}' OPTIONS ('bootstrap.servers' '{}', 'format' 'debezium-json', \
             'key' 'k');\n\
             INSERT INTO out SELECT k, count(*) AS n, sum(v) AS total FROM src GROUP BY k;\n",
            live.topic,
            common::kafka_brokers(),
            common::kafka_brokers()
        ),
    )
    .unwrap();
    (sql, out)
}

/// Replays the change events committed to `out` in order: each create is of
/// a new key, each update's and delete's `before` is the key's row then (a
/// doubled or lost event breaks the chain), and the table they leave is the
/// reference over the 5,000 records.
fn assert_debezium_table(out: &str) {
    let mut table: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut ops: BTreeMap<String, usize> = BTreeMap::new();
    for (i, (_, _, value)) in committed_records(&common::kafka_brokers(), out)
        .into_iter()
        .enumerate()
    {
        let e: Value = serde_json::from_slice(&value).unwrap();
        let op = e["op"].as_str().expect("op").to_string();
        *ops.entry(op.clone()).or_default() += 1;
        let row = |side: &str| {
            let r = &e[side];
            (
                r["k"].as_str().unwrap().to_string(),
                (r["n"].as_i64().unwrap(), r["total"].as_i64().unwrap()),
            )
        };
        match op.as_str() {
            "c" => {
                let (k, v) = row("after");
                assert!(
                    table.insert(k, v).is_none(),
                    "event {i}: a create of a key that exists: {e}"
                );
            }
            "u" => {
                let (k, before) = row("before");
                assert_eq!(
                    table.get(&k),
                    Some(&before),
                    "event {i}: an update's before is the row: {e}"
                );
                let (k, after) = row("after");
                table.insert(k, after);
            }
            "d" => {
                let (k, before) = row("before");
                assert_eq!(
                    table.remove(&k),
                    Some(before),
                    "event {i}: a delete's before is the row: {e}"
                );
            }
            other => panic!("op {other:?}"),
        }
    }
    assert_eq!(ops.get("c"), Some(&KEYS), "one create per key: {ops:?}");
    assert!(
        ops.get("u").copied().unwrap_or(0) > KEYS,
        "updates every epoch: {ops:?}"
    );
    assert_eq!(table, reference(5_000));
}

#[test]
fn debezium_change_events_rebuild_the_table() {
    let live = Live::new("updating-debezium");
    let (sql, out) = debezium_query(&live);
    drain_through_kills(&live, &sql, 2);
    assert_debezium_table(&out);
}

/// Crashed right after a sink wrote an epoch's changes and before the epoch
/// committed, the restart computes that epoch again: its changes must not
/// reach the topic twice.
#[test]
fn debezium_change_events_survive_a_crash_between_a_write_and_its_commit() {
    use std::os::unix::process::ExitStatusExt;
    let live = Live::new("updating-debezium-crash");
    let (sql, out) = debezium_query(&live);
    let crashed = live
        .command(&sql, &["--until-drained", "--interval", "10ms"])
        .env(skein_engine::crash_point::CRASH_AFTER_SINK_WRITE, "5")
        .output()
        .expect("running skein");
    assert_eq!(
        crashed.status.signal(),
        Some(6),
        "the armed run aborts after a sink write: {}",
        String::from_utf8_lossy(&crashed.stderr)
    );
    let resumed = live
        .command(&sql, &["--until-drained", "--interval", "10ms"])
        .output()
        .expect("running skein");
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert_debezium_table(&out);
}

#[test]
fn a_sink_that_only_appends_refuses_an_updating_query_naming_the_operator() {
    let live = Live::new("updating-refused");
    let cases = [
        (
            "CREATE EXTERNAL TABLE out (k VARCHAR, n BIGINT, total BIGINT) STORED AS KINESIS \
             LOCATION 'nowhere' OPTIONS ('format' 'json');",
            "KINESIS",
        ),
        (
            "CREATE EXTERNAL TABLE out (k VARCHAR, n BIGINT, total BIGINT) STORED AS REDIS \
             LOCATION 'redis://127.0.0.1:1' OPTIONS ('layout' 'list', 'key' 'l', 'value' 'n');",
            "layout 'list' only appends",
        ),
        (
            "CREATE EXTERNAL TABLE out (k VARCHAR, n BIGINT, total BIGINT) STORED AS FILES \
             LOCATION 'file:///tmp/skein-refused' OPTIONS ('format' 'json');",
            "op.column",
        ),
        (
            "CREATE EXTERNAL TABLE out (k VARCHAR, n BIGINT, total BIGINT) STORED AS KAFKA \
             LOCATION 'nowhere' OPTIONS ('bootstrap.servers' '127.0.0.1:1');",
            "'key'",
        ),
    ];
    for (sink, says) in cases {
        let sql = live.write_query(sink);
        for cmd in ["explain", "run"] {
            let (ok, stdout, stderr) = common::skein(
                &[cmd, sql.to_str().unwrap(), "--epochs", "1"][..if cmd == "run" { 4 } else { 2 }],
            );
            assert!(
                !ok,
                "{cmd} of an updating query into {sink} must fail:\n{stdout}"
            );
            let err = stderr.trim();
            assert_eq!(err.lines().count(), 1, "one line: {err}");
            assert!(
                err.contains("cannot take this query's result, which updates")
                    && err.contains(says)
                    && err.contains("GROUP BY k"),
                "{cmd}: {err}"
            );
        }
    }
}

/// The sum over members of a gauge's samples whose labels contain `label`.
fn gauge_sum(body: &str, name: &str, label: &str) -> Option<f64> {
    let values: Vec<f64> = body
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
                && l.contains(label)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// An aggregate with ten groups over a million change events keeps ten
/// entries, not the rows: read from the `skein_state_rows` gauge once every
/// event was read and two more epochs ran. The events are a Debezium topic
/// (a changelog: every fourth event deletes the row the one before it
/// created), where an aggregate cannot be split into partial aggregates and
/// the recompute path kept every live row (750,000).
#[test]
fn an_aggregate_over_a_million_change_events_keeps_its_groups_not_its_rows() {
    const EVENTS: usize = 1_000_000;
    let live = Live::new("updating-groups");
    let row = |i: usize| {
        let (_, _, k, v) = record(i);
        format!(r#"{{"k":"{k}","v":{v}}}"#)
    };
    for i in 0..EVENTS {
        let event = if i % 4 == 3 {
            format!(r#"{{"before":{},"after":null,"op":"d"}}"#, row(i - 1))
        } else {
            format!(r#"{{"before":null,"after":{},"op":"c"}}"#, row(i))
        };
        live.writer.send(0, &event);
    }
    live.writer.flush();
    let sql = live.dir.join("q.sql");
    std::fs::write(
        &sql,
        format!(
            "CREATE EXTERNAL TABLE src (k VARCHAR, v BIGINT) STORED AS KAFKA LOCATION '{}' \
             OPTIONS ('bootstrap.servers' '{}', 'format' 'debezium-json');\n\
             SELECT k, count(*) AS n, sum(v) AS total, avg(v) AS mean FROM src GROUP BY k;\n",
            live.topic,
            common::kafka_brokers()
        ),
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", common::free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(["run", sql.to_str().unwrap(), "--duration", "30m"])
        .args(["--interval", "50ms", "--metrics", &addr])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting skein");
    // A pull counts rows, and an event that deletes a row created in the
    // same pull leaves neither: the topic is read when no record is left.
    let lag = |b: &str| gauge_sum(b, "skein_source_lag_records", "");
    let epochs = |b: &str| gauge_sum(b, "skein_epochs_total", "");
    let read_all = common::wait_until(
        &mut child,
        Duration::from_secs(600),
        "every event read",
        || {
            common::scrape(&addr)
                .filter(|b| lag(b) == Some(0.0))
                .and_then(|b| epochs(&b))
        },
    );
    let body = common::wait_until(
        &mut child,
        Duration::from_secs(120),
        "two epochs after the last event",
        || common::scrape(&addr).filter(|b| epochs(b).is_some_and(|e| e >= read_all + 2.0)),
    );
    let _ = child.kill();
    let _ = child.wait();
    let kept = gauge_sum(&body, "skein_state_rows", "").expect("skein_state_rows");
    // Every event gave a row, but for the pairs a pull cancelled (a create
    // and its delete): at least the 500,000 creates no delete took back.
    let rows = gauge_sum(&body, "skein_source_records_total", "").expect("records");
    assert!(rows >= (EVENTS / 2) as f64, "rows read: {rows}\n{body}");
    assert_eq!(
        kept, KEYS as f64,
        "the updating stage keeps one entry per group:\n{body}"
    );
}

/// Record `i` of a stream whose keys drift: mostly the newest key (one per
/// 20 records), every fifth an older one. `(partition, json, key, v)`.
fn drifting(i: usize) -> (usize, String, String, i64) {
    let newest = i / 20;
    let k = if i % 5 == 4 {
        format!("g{}", (i * 7919) % (newest + 1))
    } else {
        format!("g{newest}")
    };
    let v = (i as i64 * 13) % 500;
    let json = format!(
        r#"{{"k":"{k}","v":{v},"ts":{}}}"#,
        1_700_000_000_000i64 + i as i64
    );
    (i % PARTITIONS, json, k, v)
}

/// How [`exact_through_kills_with_state_on_disk`] feeds and kills a run.
struct Steps {
    /// Steps of `records` records, each followed by `epochs` commits, the
    /// run SIGKILLed after every `kill_every`-th.
    steps: usize,
    records: usize,
    epochs: u64,
    kill_every: usize,
    /// Records per round while the last run catches up.
    more: usize,
}

/// Runs `sql` (members keeping 1 KiB of groups in memory) through
/// `steps`, `produce(n)` writing n records and returning the reference
/// Redis rows; then a last run with metrics until `gauge` shows state on
/// disk and Redis equals the reference, stopped with SIGTERM.
fn exact_through_kills_with_state_on_disk(
    live: &Live,
    sql: &Path,
    prefix: &str,
    gauge: &str,
    mut produce: impl FnMut(usize) -> BTreeMap<String, (i64, i64)>,
    steps: Steps,
) {
    let checkpoints = live.checkpoints();
    let spawn = |extra: &[&str]| live.spawn_in_1kib(sql, extra);
    let mut child = spawn(&[]);
    wait_for_commit(&mut child, &checkpoints, 1);
    let mut reference = BTreeMap::new();
    for step in 0..steps.steps {
        reference = produce(steps.records);
        wait_for_epochs(&mut child, &checkpoints, steps.epochs);
        if step % steps.kill_every == 1 {
            sigkill(&mut child);
            child = spawn(&[]);
        }
    }
    sigkill(&mut child);
    // The last run shows its gauges; records keep coming, so its epochs
    // reach the aggregate, whose restored state goes to disk again.
    let addr = format!("127.0.0.1:{}", common::free_port());
    let mut child = spawn(&["--metrics", &addr]);
    let mut rounds = 0;
    loop {
        wait_for_epochs(&mut child, &checkpoints, 3);
        let on_disk = common::scrape(&addr)
            .and_then(|b| gauge_sum(&b, gauge, ""))
            .unwrap_or(0.0);
        let redis = redis_counts(prefix);
        if on_disk > 0.0 && redis == reference {
            break;
        }
        rounds += 1;
        assert!(
            rounds < 200,
            "{gauge} {on_disk}; Redis {} keys of {}: {redis:?} against {reference:?}",
            redis.len(),
            reference.len()
        );
        reference = produce(steps.more);
    }
    stop_with_sigterm(child);
    assert_eq!(redis_counts(prefix), reference, "at the end");
}

/// An aggregate whose members may keep 1 KiB of groups in memory moves the
/// groups no epoch touched lately to local disk, and takes them back when
/// an older key comes again: its Redis rows equal a reference through
/// SIGKILLs (each restart reads the checkpoint, written from memory and
/// disk), and the `skein_state_spilled_rows` gauge shows groups on disk.
#[test]
fn an_aggregate_that_moves_cold_groups_to_disk_is_exact_through_kills() {
    common::require_redis();
    let live = Live::new("updating-spill");
    let prefix = common::unique_name("spill");
    let sql = live.write_query(&redis_hashes(&prefix));
    let mut reference: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut produced = 0;
    let produce = |n: usize| {
        for i in produced..produced + n {
            let (p, json, k, v) = drifting(i);
            live.writer.send(p as i32, &json);
            let e = reference.entry(k).or_default();
            e.0 += 1;
            e.1 += v;
        }
        live.writer.flush();
        produced += n;
        reference.clone()
    };
    // Enough epochs after each step for its keys to go cold (8 idle epochs).
    let steps = Steps {
        steps: 9,
        records: 1_000,
        epochs: 12,
        kill_every: 3,
        more: 50,
    };
    exact_through_kills_with_state_on_disk(
        &live,
        &sql,
        &prefix,
        "skein_state_spilled_rows",
        produce,
        steps,
    );
}

/// A distinct count over a few keys that every epoch touches, whose members
/// may keep 1 KiB of groups in memory: the values no row named lately go to
/// local disk from groups that stay, and come back when a row names one
/// again. Its Redis rows equal a reference through SIGKILLs, and the
/// `skein_state_spilled_values` gauge shows values on disk.
#[test]
fn a_distinct_count_that_moves_cold_values_to_disk_is_exact_through_kills() {
    common::require_redis();
    let live = Live::new("updating-spill-values");
    let prefix = common::unique_name("spillv");
    let sql = live.dir.join("q.sql");
    std::fs::write(
        &sql,
        format!(
            "{}{}\nINSERT INTO out SELECT k, count(DISTINCT v) AS n, count(*) AS total \
             FROM src GROUP BY k;\n",
            live.source(),
            redis_hashes(&prefix)
        ),
    )
    .expect("writing the query");
    // Three keys, each value new most of the time and now and then one
    // seen long before (back from disk).
    let record = |i: usize| {
        let k = format!("d{}", i % 3);
        let v = if i % 7 == 6 {
            ((i * 7919) % (i + 1)) as i64
        } else {
            i as i64
        };
        let json = format!(
            r#"{{"k":"{k}","v":{v},"ts":{}}}"#,
            1_700_000_000_000i64 + i as i64
        );
        (i % PARTITIONS, json, k, v)
    };
    let mut values: BTreeMap<String, (std::collections::BTreeSet<i64>, i64)> = BTreeMap::new();
    let mut produced = 0;
    let produce = |n: usize| {
        for i in produced..produced + n {
            let (p, json, k, v) = record(i);
            live.writer.send(p as i32, &json);
            let e = values.entry(k).or_default();
            e.0.insert(v);
            e.1 += 1;
        }
        live.writer.flush();
        produced += n;
        values
            .iter()
            .map(|(k, (set, n))| (k.clone(), (set.len() as i64, *n)))
            .collect::<BTreeMap<String, (i64, i64)>>()
    };
    let steps = Steps {
        steps: 6,
        records: 2_000,
        epochs: 6,
        kill_every: 2,
        more: 300,
    };
    exact_through_kills_with_state_on_disk(
        &live,
        &sql,
        &prefix,
        "skein_state_spilled_values",
        produce,
        steps,
    );
}
