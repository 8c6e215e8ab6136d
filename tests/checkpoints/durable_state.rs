//! Durable state through crashes: a windowed count and sum per key, read
//! from a 4-partition Kafka topic at the default group size, killed with
//! SIGKILL at random moments and restarted from its checkpoint directory,
//! must write exactly the rows a reference computed here says: none
//! missing, doubled or partial, into each exactly-once sink (files; Kafka
//! read with read_committed; Redis, a list per window so a double shows), and from a Kinesis stream (ministack).
//!
//! The Kafka cases take 2,000,000 records (about a minute each in a debug
//! build); `SKEIN_DURABLE_RECORDS` sets another number for every case and
//! `SKEIN_DURABLE_KILLS` the number of kills (default 10).

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::rows::read_rows;
use crate::common::windowed::{self, Reference, assert_exact};
use skein::report::Report;

const PARTITIONS: usize = 4;
/// Event time the records span: the 10 s windows close 25 times.
const SPAN_MS: i64 = 250_000;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A fresh topic holding the records; returns the table `ev` reading it.
fn kafka_source(records: &[(usize, String)]) -> String {
    windowed::kafka_table(records, PARTITIONS, 1000)
}

/// A fresh Kinesis stream (ministack) holding the records, one shard per
/// partition by explicit hash key; returns the table `ev` reading it.
async fn kinesis_source(records: &[(usize, String)]) -> String {
    use aws_sdk_kinesis::primitives::Blob;
    use aws_sdk_kinesis::types::PutRecordsRequestEntry;
    common::require_aws();
    let stream = common::unique_name("durable");
    let shards = 2;
    common::create_stream(&stream, shards as i32).await;
    let kinesis = aws_sdk_kinesis::Client::new(&common::aws_sdk_config().await);
    // Shard s owns hash keys [s, s+1) * 2^128 / shards: its middle routes there.
    let hash_key = |p: usize| {
        let shard = (p % shards) as u128;
        ((u128::MAX / shards as u128) * shard + u128::MAX / (2 * shards as u128)).to_string()
    };
    for chunk in records.chunks(500) {
        let entries = chunk
            .iter()
            .map(|(p, json)| {
                PutRecordsRequestEntry::builder()
                    .partition_key("k")
                    .explicit_hash_key(hash_key(*p))
                    .data(Blob::new(json.clone()))
                    .build()
                    .expect("a record")
            })
            .collect();
        common::put_records(&kinesis, &stream, entries).await;
    }
    format!(
        "CREATE EXTERNAL TABLE ev (k VARCHAR, v BIGINT, ts TIMESTAMP) STORED AS KINESIS \
           LOCATION '{stream}' OPTIONS ('format' 'json', 'event_time' 'ts', \
           'max.records.per.pull' '200');"
    )
}

/// The query file: the table `ev`, the sink `out` (its DDL), the query.
fn query(dir: &Path, source: &str, sink: &str) -> std::path::PathBuf {
    let file = dir.join("q.sql");
    std::fs::write(&file, windowed::query(source, sink)).expect("writing the query");
    file
}

fn run_command(sql: &Path, checkpoints: &Path) -> Command {
    let mut c = common::skein_command_on_aws();
    c.args(["run", sql.to_str().expect("utf-8 path")])
        .args(["--until-drained", "--interval", "10ms", "--json"])
        // Commits every 4th epoch: a kill then lands after writes that are
        // not committed yet, and the restart writes those epochs again, so
        // a sink that took a replay for new rows would double them.
        .args(["--checkpoint-interval", "4"])
        .args([
            "--checkpoint-dir",
            checkpoints.to_str().expect("utf-8 path"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs the query in `dir` to the end through `kills` SIGKILLs and
/// restarts; every kill landed, all but the early third of them after the
/// killed run had committed an epoch, and the last run resumed after the
/// last commit. Returns the last run's report.
fn run_through_kills(dir: &Path, sql: &Path, kills: usize) -> Report {
    let checkpoints = dir.join("checkpoints");
    let run =
        common::kills::run_through_kills(|| run_command(sql, &checkpoints), &checkpoints, kills);
    let late = kills - kills.div_ceil(3);
    assert!(
        run.mid_run() >= late,
        "{} of {kills} kills cut a run after a commit, {late} were planned so: {:?}",
        run.mid_run(),
        run.kills
    );
    let report: Report = run.assert_resumed();
    assert!(
        report.resumed_after.is_some(),
        "the last run resumed from a checkpoint: {report:?}"
    );
    report
}

/// Runs the query in `dir` once armed to crash right after its sink wrote
/// rows of epoch `at` or later, before that epoch commits, then again to the
/// end. The crash landed there, the second run resumed after a commit, and
/// it wrote the crashed epoch again: only the sink's replay detection keeps
/// those rows from doubling. Returns the second run's report.
fn crash_after_a_sink_write(dir: &Path, sql: &Path, at: u64) -> Report {
    use std::os::unix::process::ExitStatusExt;
    let checkpoints = dir.join("checkpoints");
    let crashed = run_command(sql, &checkpoints)
        .env(
            skein_engine::crash_point::CRASH_AFTER_SINK_WRITE,
            at.to_string(),
        )
        .output()
        .expect("running skein");
    let stderr = String::from_utf8_lossy(&crashed.stderr);
    assert_eq!(
        crashed.status.signal(),
        Some(6),
        "the armed run aborts after a sink write: {:?}\n{stderr}",
        crashed.status
    );
    let crashed_at: u64 = stderr
        .split("rows of epoch ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|epoch| epoch.trim_end_matches(',').parse().ok())
        .unwrap_or_else(|| panic!("the crash names its epoch: {stderr}"));
    let committed = common::kills::committed_epoch(&checkpoints);
    assert!(
        committed.is_none_or(|c| c < crashed_at),
        "epoch {crashed_at} crashed before it committed (commit {committed:?})"
    );
    let resumed = run_command(sql, &checkpoints)
        .output()
        .expect("running skein");
    assert!(
        resumed.status.success(),
        "the run after the crash finishes: {}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let report = common::run_report(&String::from_utf8_lossy(&resumed.stdout));
    assert_eq!(
        report.resumed_after, committed,
        "the second run resumed after the last commit: {report:?}"
    );
    report
}

/// A test's input and working directory.
struct Setup {
    source: String,
    reference: Reference,
    kills: usize,
    dir: std::path::PathBuf,
}

fn setup(records: usize, kills: usize, source: impl FnOnce(&[(usize, String)]) -> String) -> Setup {
    let n = env_number("SKEIN_DURABLE_RECORDS", records);
    let kills = env_number("SKEIN_DURABLE_KILLS", kills);
    let (records, reference) = windowed::records(n, PARTITIONS, SPAN_MS);
    let source = source(&records);
    let dir = std::env::temp_dir().join(common::unique_name("skein-durable"));
    std::fs::create_dir_all(&dir).expect("a working directory");
    Setup {
        source,
        reference,
        kills,
        dir,
    }
}

impl Setup {
    /// A fresh output directory and the files table `out` writing to it.
    fn files_sink(&self) -> (std::path::PathBuf, String) {
        let out = self.dir.join("out");
        std::fs::create_dir_all(&out).expect("an output directory");
        let ddl = windowed::files_sink(&out);
        (out, ddl)
    }

    /// Runs the query into the sink `out` (its DDL) through a crash right
    /// after the sink wrote rows of epoch 6 or later.
    fn run_crashing_after_a_sink_write(&self, sink: &str) -> Report {
        let sql = query(&self.dir, &self.source, sink);
        crash_after_a_sink_write(&self.dir, &sql, 6)
    }

    /// Runs the query into the sink `out` (its DDL) through the kills.
    fn run(&self, sink: &str) -> Report {
        let sql = query(&self.dir, &self.source, sink);
        run_through_kills(&self.dir, &sql, self.kills)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn killed_at_random_moments_the_files_sink_holds_the_exact_result() {
    let setup = setup(2_000_000, 10, kafka_source);
    let (out, sink) = setup.files_sink();
    let report = setup.run(&sink);
    assert_exact(
        &read_rows(&out, true),
        &setup.reference,
        &format!("files {report:?}"),
    );
}

#[test]
fn killed_at_random_moments_the_kafka_sink_holds_the_exact_result() {
    let setup = setup(2_000_000, 10, kafka_source);
    let (out, sink) = windowed::kafka_sink();
    let report = setup.run(&sink);
    assert_exact(
        &windowed::kafka_rows(&out),
        &setup.reference,
        &format!("kafka read_committed {report:?}"),
    );
}

/// A list per (window, key) holding the count: a replayed epoch written
/// again, or a window written partial and then complete, leaves a list of
/// two (a hash per window would be overwritten in place and hide both).
#[test]
fn killed_at_random_moments_the_redis_sink_holds_the_exact_result() {
    let setup = setup(2_000_000, 10, kafka_source);
    let url = common::require_redis();
    let prefix = common::unique_name("durable");
    let report = setup.run(&windowed::redis_list_sink(&url, &prefix));
    println!("redis {report:?}");
    windowed::assert_lists_exact(&url, &prefix, &setup.reference, &[]);
}

#[test]
fn a_kinesis_source_killed_at_random_moments_counts_every_record_once() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let setup = setup(20_000, 5, |records| {
        runtime.block_on(kinesis_source(records))
    });
    let (out, sink) = setup.files_sink();
    let report = setup.run(&sink);
    assert_exact(
        &read_rows(&out, true),
        &setup.reference,
        &format!("kinesis to files {report:?}"),
    );
}

/// Crashed between a sink write and its commit, each exactly-once sink gets
/// the same epoch twice: the files sink must keep one copy, the Kafka sink
/// must not commit a second transaction of it, the Redis sink must skip it
/// (its lists would show two entries). Turning any sink's replay detection
/// off fails these.
#[test]
fn a_crash_between_a_sink_write_and_its_commit_doubles_nothing_in_files() {
    let setup = setup(200_000, 0, kafka_source);
    let (out, sink) = setup.files_sink();
    let report = setup.run_crashing_after_a_sink_write(&sink);
    assert_exact(
        &read_rows(&out, true),
        &setup.reference,
        &format!("files {report:?}"),
    );
}

#[test]
fn a_crash_between_a_sink_write_and_its_commit_doubles_nothing_in_kafka() {
    let setup = setup(200_000, 0, kafka_source);
    let (out, sink) = windowed::kafka_sink();
    let report = setup.run_crashing_after_a_sink_write(&sink);
    assert_exact(
        &windowed::kafka_rows(&out),
        &setup.reference,
        &format!("kafka read_committed {report:?}"),
    );
}

#[test]
fn a_crash_between_a_sink_write_and_its_commit_doubles_nothing_in_redis() {
    let setup = setup(200_000, 0, kafka_source);
    let url = common::require_redis();
    let prefix = common::unique_name("crash");
    let report = setup.run_crashing_after_a_sink_write(&windowed::redis_list_sink(&url, &prefix));
    println!("redis {report:?}");
    windowed::assert_lists_exact(&url, &prefix, &setup.reference, &[]);
}
