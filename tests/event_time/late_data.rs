//! Event time on a real Kafka broker: late rows (dropped or dead-lettered,
//! never a second partial row), an empty topic that neither stalls nor ends
//! a query, a topic that ends in transaction markers, and bad event-time
//! options refused at CREATE TABLE.
//!
//! Needs Kafka on `SKEIN_KAFKA` (default 127.0.0.1:9092): `scripts/services.sh start`.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use skein::report::Report;
use skein_engine::epochs::Stopped;

/// A hang guard, not a measure: what a test waits for has its own condition.
const HANG_GUARD: Duration = Duration::from_secs(300);

/// 10 s windows from here (a round number of windows since the epoch).
const BASE_MS: i64 = 1_700_000_000_000;

fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let results = rt
        .block_on(admin.create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        ))
        .expect("create topic");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
}

/// `{"k", "v", "ts"}` records into one partition, in the order given.
fn produce(brokers: &str, topic: &str, partition: i32, records: &[(&str, i64, i64)]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    for (k, v, ts) in records {
        let value = format!(r#"{{"k":"{k}","v":{v},"ts":{ts}}}"#);
        producer
            .send(
                BaseRecord::<(), _>::to(topic)
                    .partition(partition)
                    .payload(&value),
            )
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

fn write_sql(name: &str, sql: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}.sql", common::unique_name(name)));
    std::fs::write(&path, sql).unwrap();
    path.display().to_string()
}

/// Every JSON row the files sink wrote under `dir`.
fn rows_under(dir: &Path) -> Vec<serde_json::Value> {
    let mut out = vec![];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            out.extend(rows_under(&path));
        } else if path.extension().is_some_and(|x| x == "json") {
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                if !line.trim().is_empty() {
                    out.push(serde_json::from_str(line).unwrap());
                }
            }
        }
    }
    out
}

/// `CREATE EXTERNAL TABLE <name> (k, v, ts)` over a Kafka topic, with more
/// options after the broker's (each starting with a comma).
fn kafka_table(name: &str, topic: &str, brokers: &str, options: &str) -> String {
    format!(
        "CREATE EXTERNAL TABLE {name} (k VARCHAR, v BIGINT, ts TIMESTAMP) STORED AS KAFKA \
         LOCATION '{topic}' OPTIONS ('bootstrap.servers' '{brokers}'{options});"
    )
}

/// Run `skein run SQL ARGS --json`; its report, or a failure naming `what`.
fn run_report(what: &str, sql: &str, args: &[&str]) -> Report {
    let mut all = vec!["run", sql];
    all.extend_from_slice(args);
    all.push("--json");
    let (ok, stdout, stderr) = common::skein(&all);
    assert!(ok, "{what} failed:\n{stderr}");
    common::run_report(&stdout)
}

/// Window start (ms) -> (count, sum) of the rows the query wrote.
fn counts(rows: &[serde_json::Value]) -> BTreeMap<i64, Vec<(i64, i64)>> {
    let mut out: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
    for r in rows {
        let w = r["w"]
            .as_i64()
            .unwrap_or_else(|| panic!("window as ms: {r}"));
        out.entry(w)
            .or_default()
            .push((r["c"].as_i64().unwrap(), r["s"].as_i64().unwrap()));
    }
    out
}

/// One partition: 60 s of rows 100 ms apart, then one row for the first
/// window, read in pulls of 50 records: by the time the last row comes,
/// the first window has been emitted.
fn late_table(brokers: &str, extra_options: &str) -> (String, String, std::path::PathBuf) {
    let topic = common::unique_name("late");
    create_topic(brokers, &topic, 1);
    let mut records: Vec<(&str, i64, i64)> =
        (0..600).map(|i| ("a", 1, BASE_MS + i * 100)).collect();
    records.push(("a", 1000, BASE_MS + 5));
    produce(brokers, &topic, 0, &records);
    let out = std::env::temp_dir().join(common::unique_name("late-out"));
    let sql = write_sql(
        "late",
        &format!(
            "{}
             CREATE EXTERNAL TABLE out (w BIGINT, c BIGINT, s BIGINT) STORED AS FILES LOCATION 'file://{}' OPTIONS ('format' 'json');
             INSERT INTO out
             SELECT CAST(tumble(ts, INTERVAL '10' SECOND) AS BIGINT) AS w, count(*) AS c, sum(v) AS s
             FROM ev GROUP BY tumble(ts, INTERVAL '10' SECOND)",
            kafka_table(
                "ev",
                &topic,
                brokers,
                &format!(", 'event_time' 'ts', 'max.records.per.pull' '50' {extra_options}")
            ),
            out.display()
        ),
    );
    (topic, sql, out)
}

#[test]
fn a_late_row_is_dropped_and_counted_never_a_second_row() {
    let brokers = common::require_kafka();
    let (_, sql, out) = late_table(&brokers, "");
    let args = ["--until-drained", "--interval", "50ms", "--group-size", "2"];
    let r = run_report("the run", &sql, &args);
    assert_eq!(r.late_rows, Some(1), "{r:?}");
    assert_eq!(
        r.late_rows_by_table.as_ref().and_then(|t| t.get("ev")),
        Some(&1),
        "{r:?}"
    );
    assert_eq!(r.events, 601, "each record counted once: {r:?}");
    let by_window = counts(&rows_under(&out));
    assert_eq!(by_window.len(), 6, "six 10 s windows: {by_window:?}");
    for (w, rows) in &by_window {
        assert_eq!(
            rows,
            &vec![(100, 100)],
            "window {w}: one row of 100 rows, v summing to 100"
        );
    }
}

#[test]
fn a_late_row_goes_to_the_dead_letter_topic_with_its_window() {
    let brokers = common::require_kafka();
    let dead = common::unique_name("late-dead");
    create_topic(&brokers, &dead, 1);
    let (topic, sql, out) = late_table(
        &brokers,
        &format!(", 'late' 'dead-letter', 'dead.letter.topic' '{dead}'"),
    );
    let r = run_report("the run", &sql, &["--until-drained", "--interval", "50ms"]);
    assert_eq!(r.late_rows, Some(1), "{r:?}");
    assert_eq!(counts(&rows_under(&out)).len(), 6);

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", common::unique_name("late-dead-reader"))
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&dead, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let started = std::time::Instant::now();
    let letter = loop {
        assert!(
            started.elapsed() < HANG_GUARD,
            "no dead letter in {dead} (the run that sent it has ended)"
        );
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(500)) {
            break serde_json::from_slice::<serde_json::Value>(m.payload().unwrap()).unwrap();
        }
    };
    assert_eq!(letter["reason"], "late", "{letter}");
    assert_eq!(letter["table"], "ev", "{letter}");
    assert_eq!(letter["window_start_ms"], BASE_MS, "{letter}");
    assert_eq!(letter["window_end_ms"], BASE_MS + 10_000, "{letter}");
    assert!(letter["row"].is_object(), "{letter}");
    let _ = topic;
}

#[test]
fn an_empty_topic_neither_stalls_nor_ends_a_query() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("empty");
    create_topic(&brokers, &topic, 2);
    let sql = write_sql(
        "empty",
        &format!(
            "{}
             SELECT tumble(ts, INTERVAL '10' SECOND) AS w, count(*) AS c FROM ev GROUP BY 1",
            kafka_table(
                "ev",
                &topic,
                &brokers,
                ", 'event_time' 'ts', 'parallelism' '2'"
            )
        ),
    );
    // A standing run on the empty topic: it goes on firing epochs (it
    // neither stalls nor ends) until it is stopped.
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_skein"))
        .args([
            "run",
            &sql,
            "--interval",
            "200ms",
            "--json",
            "--metrics",
            &metrics,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting skein run");
    let epochs = common::wait_until(&mut child, HANG_GUARD, "6 epochs on an empty topic", || {
        let body = common::scrape(&metrics)?;
        let n: f64 = body
            .lines()
            .filter(|l| l.starts_with("skein_epochs_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        (n >= 6.0).then_some(n)
    });
    let sent = std::process::Command::new("kill")
        .args(["-s", "TERM", &child.id().to_string()])
        .status()
        .expect("running kill");
    assert!(sent.success(), "kill -s TERM");
    let out = common::wait_with_timeout(child, HANG_GUARD);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the standing run failed:\n{stderr}");
    let r = common::run_report(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        r.stopped,
        Stopped::Signal,
        "ended by the signal only: {r:?}"
    );
    assert_eq!(r.result_rows, 0, "{r:?}");
    assert!(
        r.epochs as f64 >= epochs,
        "{epochs} epochs counted while it ran: {r:?}"
    );
    let r = run_report(
        "--until-drained on an empty topic",
        &sql,
        &["--until-drained"],
    );
    assert_eq!(r.events, 0, "{r:?}");
}

#[test]
fn a_topic_ending_in_transaction_markers_is_read_to_its_end() {
    let brokers = common::require_kafka();
    let input = common::unique_name("tx-in");
    let output = common::unique_name("tx-out");
    create_topic(&brokers, &input, 2);
    create_topic(&brokers, &output, 2);
    let records: Vec<(&str, i64, i64)> = (0..2000).map(|i| ("a", i, BASE_MS + i * 50)).collect();
    produce(&brokers, &input, 0, &records[..1000]);
    produce(&brokers, &input, 1, &records[1000..]);
    // The exactly-once sink writes in transactions: the output topic's
    // partitions end in commit markers.
    let copy = write_sql(
        "tx-copy",
        &format!(
            "{}\n{}\nINSERT INTO copy SELECT k, v, ts FROM ev",
            kafka_table("ev", &input, &brokers, ", 'parallelism' '2'"),
            kafka_table(
                "copy",
                &output,
                &brokers,
                &format!(
                    ", 'checkpoint' '{}', 'key' 'k'",
                    common::unique_name("tx-cp")
                )
            ),
        ),
    );
    let (ok, _, stderr) = common::skein(&["run", &copy, "--until-drained"]);
    assert!(ok, "copy failed:\n{stderr}");
    let windows = write_sql(
        "tx-windows",
        &format!(
            "{}
             SELECT tumble(ts, INTERVAL '10' SECOND) AS w, count(*) AS c FROM copy GROUP BY 1",
            kafka_table(
                "copy",
                &output,
                &brokers,
                ", 'event_time' 'ts', 'parallelism' '2', 'pull.timeout.ms' '600000'"
            )
        ),
    );
    // A reader that waited for the markers would spend its 10-minute pull
    // timeout on a pull, past the hang guard; this one finishes as soon as
    // it has read the records.
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_skein"))
        .args([
            "run",
            &windows,
            "--until-drained",
            "--interval",
            "50ms",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting skein run");
    let out = common::wait_with_timeout(child, HANG_GUARD);
    assert!(
        out.status.success(),
        "windows over a transactional topic failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = common::run_report(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(r.events, 2000, "{r:?}");
    assert_eq!(
        r.result_rows, 10,
        "100 s of event time in 10 s windows: {r:?}"
    );
}

#[test]
fn bad_event_time_options_are_refused_with_their_name() {
    let brokers = common::require_kafka();
    for (options, named) in [
        ("'lateness_ms' 'abc'", "lateness_ms"),
        ("'idle.timeout' 'soon'", "idle.timeout"),
        ("'late' 'keep'", "late"),
        ("'late' 'dead-letter'", "dead.letter.topic"),
    ] {
        let sql = write_sql(
            "bad-et",
            &format!(
                "CREATE EXTERNAL TABLE ev (k VARCHAR, ts TIMESTAMP) STORED AS KAFKA LOCATION 'nowhere'
                   OPTIONS ('bootstrap.servers' '{brokers}', 'event_time' 'ts', {options});
                 SELECT count(*) FROM ev"
            ),
        );
        let (ok, _, stderr) = common::skein(&["run", &sql, "--epochs", "1"]);
        assert!(!ok, "{options} was accepted");
        assert!(
            stderr.contains(named),
            "{options}: the error names {named}:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
