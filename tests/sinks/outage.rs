//! A sink that cannot write (issue #26).
//!
//! - A bounded run (`--duration 10s`) ends at its bound plus one retry step
//!   (3.2 s) whatever its sink does, failing with one line that names the
//!   sink, its address and the last error: a dead Redis, a dead Kafka
//!   broker under a Kafka sink, an unreachable S3 endpoint under a files
//!   sink. With `retry.timeout.ms` set, it waits that long and says so.
//! - A standing run rides the outage out: while its sink cannot write,
//!   `skein status --json` lists the sink as failing and `/metrics` has its
//!   consecutive failures; once the service is back it writes again by
//!   itself, and what the sink holds in the end is the reference exactly
//!   (a Redis list per window and key, so a doubled write shows as a second
//!   element).
//!
//! The services that go down are this test's own (`redis-server` on a free
//! port, a Kafka broker through `scripts/services.sh start kafka-outage`);
//! the shared ones are never stopped. The bounds are the one place these
//! tests read the wall clock: the claim is about time. The slack on top of
//! bound + step covers starting the process on a loaded 2-core machine.

use crate::common;

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::kills::committed_epoch;
use crate::common::services::{PrivateBroker, PrivateRedis};
use crate::common::windowed::{self, Reference};
use skein_engine::sink_health::SinkHealthReport;
use skein_engine::status::QueryStatus;

const BOUND: Duration = Duration::from_secs(10);
/// One retry step: the longest wait between a sink's attempts.
const STEP: Duration = Duration::from_millis(3200);
/// Process start, planning and exit on a loaded machine.
const SLACK: Duration = Duration::from_secs(6);

/// The generator into `sink_ddl` (a table `out (auction, price)`), run for
/// `--duration 10s` with `env`: (output, how long it took).
fn bounded_run(sink_ddl: &str, env: &[(&str, String)]) -> (Output, Duration) {
    let dir = std::env::temp_dir().join(common::unique_name("skein-sink-outage"));
    std::fs::create_dir_all(&dir).expect("a working directory");
    let sql = dir.join("q.sql");
    std::fs::write(
        &sql,
        format!(
            "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid' \
               OPTIONS ('events' '100000000', 'events_per_epoch' '100');\n\
             {sink_ddl}\n\
             INSERT INTO out SELECT auction, price FROM bid;\n"
        ),
    )
    .expect("writing the query");
    let mut command = Command::new(env!("CARGO_BIN_EXE_skein"));
    command
        .args(["run", sql.to_str().expect("utf-8"), "--duration", "10s"])
        .args(["--interval", "500ms"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let child = command.spawn().expect("starting skein");
    let out = common::wait_with_timeout(child, Duration::from_secs(300));
    let took = started.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    (out, took)
}

/// The run failed within the bound plus a step, on one `Error:` line that
/// holds each of `names`; returns that line.
fn assert_ends_at_bound(out: &Output, took: Duration, names: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a dead sink fails the run:\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "{stderr}"
    );
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("Error:")).collect();
    assert_eq!(errors.len(), 1, "one error line:\n{stderr}");
    let line = errors[0].to_string();
    for name in names {
        assert!(line.contains(name), "{name:?} missing from: {line}");
    }
    assert!(line.contains("last error"), "{line}");
    let most = BOUND + STEP + SLACK;
    assert!(
        took <= most,
        "ended after {took:?}, past the bound + a step ({most:?} with slack):\n{stderr}"
    );
    println!("ended after {took:?}: {line}");
    line
}

#[test]
fn a_dead_redis_ends_a_bounded_run_at_its_bound() {
    let url = format!("redis://127.0.0.1:{}", common::free_port());
    let (out, took) = bounded_run(
        &format!(
            "CREATE EXTERNAL TABLE out (auction BIGINT, price BIGINT) STORED AS REDIS \
               LOCATION '{url}' OPTIONS ('layout' 'list', 'key' 'a{{auction}}', 'value' 'price');"
        ),
        &[],
    );
    assert_ends_at_bound(&out, took, &[&url, "Connection refused"]);
}

#[test]
fn a_dead_kafka_broker_ends_a_bounded_run_at_its_bound() {
    let brokers = format!("127.0.0.1:{}", common::free_port());
    let (out, took) = bounded_run(
        &format!(
            "CREATE EXTERNAL TABLE out (auction BIGINT, price BIGINT) STORED AS KAFKA \
               LOCATION 'nowhere' OPTIONS ('bootstrap.servers' '{brokers}');"
        ),
        &[],
    );
    assert_ends_at_bound(&out, took, &[&brokers, "nowhere"]);
}

#[test]
fn an_unreachable_s3_endpoint_ends_a_bounded_run_at_its_bound() {
    let endpoint = format!("http://127.0.0.1:{}", common::free_port());
    let (out, took) = bounded_run(
        "CREATE EXTERNAL TABLE out (auction BIGINT, price BIGINT) STORED AS FILES \
           LOCATION 's3://no-such-bucket/out';",
        &[
            ("AWS_ENDPOINT_URL", endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_REGION", "us-east-1".into()),
        ],
    );
    assert_ends_at_bound(&out, took, &[&endpoint, "s3://no-such-bucket/out"]);
}

#[test]
fn a_table_that_sets_its_retry_timeout_waits_past_the_bound_and_says_so() {
    let url = format!("redis://127.0.0.1:{}", common::free_port());
    let wait = Duration::from_secs(14);
    let (out, took) = bounded_run(
        &format!(
            "CREATE EXTERNAL TABLE out (auction BIGINT, price BIGINT) STORED AS REDIS \
               LOCATION '{url}' OPTIONS ('layout' 'list', 'key' 'a{{auction}}', \
               'value' 'price', 'retry.timeout.ms' '{}');",
            wait.as_millis()
        ),
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(took >= wait, "gave up after {took:?}, before {wait:?}");
    assert!(took <= wait + STEP + SLACK, "took {took:?}:\n{stderr}");
    assert!(
        stderr.contains("the run's bound has passed") && stderr.contains("retry.timeout.ms"),
        "says it waits past the bound:\n{stderr}"
    );
}

#[test]
fn zero_epochs_is_refused_on_one_line() {
    let (ok, _, stderr) = common::skein(&["run", "no-such.sql", "--epochs", "0"]);
    assert!(!ok);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.contains("--epochs") && first.contains("at least 1"),
        "{stderr}"
    );
}

// ---- standing runs ----

const PARTITIONS: usize = 2;
const RECORDS: usize = 4_000;
/// Event time the records span: the 10 s windows close 20 times.
const SPAN_MS: i64 = 200_000;
/// How long a condition may take on a loaded machine before the test fails.
const PATIENCE: Duration = Duration::from_secs(180);

/// A service a standing test stops and starts again.
trait Outage {
    fn down(&mut self);
    fn up(&mut self);
}

/// A standing run of the windowed count into `sink` (a DDL of `out`),
/// serving metrics, with its checkpoint directory.
struct Standing {
    dir: PathBuf,
    sql: PathBuf,
    topic: String,
    metrics: String,
}

impl Standing {
    fn new(sink: &str) -> Self {
        let dir = std::env::temp_dir().join(common::unique_name("skein-sink-standing"));
        std::fs::create_dir_all(&dir).expect("a working directory");
        let (topic, source) = windowed::empty_kafka_table(PARTITIONS, 500);
        let sql = dir.join("q.sql");
        std::fs::write(&sql, windowed::query(&source, sink)).expect("writing the query");
        Standing {
            dir,
            sql,
            topic,
            metrics: format!("127.0.0.1:{}", common::free_port()),
        }
    }

    fn checkpoints(&self) -> PathBuf {
        self.dir.join("checkpoints")
    }

    fn command(&self, bound: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_skein"));
        c.args(["run", self.sql.to_str().expect("utf-8 path")])
            .args(bound)
            .args(["--interval", "200ms", "--json", "--checkpoint-dir"])
            .arg(self.checkpoints())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// `skein status --json` of the run.
    fn status(&self) -> QueryStatus {
        let (ok, stdout, stderr) = common::skein(&[
            "status",
            self.sql.to_str().expect("utf-8"),
            "--checkpoint-dir",
            self.checkpoints().to_str().expect("utf-8"),
            "--json",
        ]);
        assert!(ok, "skein status: {stderr}");
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    }

    /// The failing sinks `skein status --json` lists.
    fn failing_sinks(&self) -> Vec<SinkHealthReport> {
        self.status()
            .sinks
            .into_iter()
            .filter(|s| s.consecutive_failures > 0)
            .collect()
    }

    /// The gauge of consecutive failures on /metrics, once served.
    fn failures_gauge(&self) -> Option<f64> {
        let body = common::scrape(&self.metrics)?;
        body.lines()
            .find(|l| l.starts_with("skein_sink_consecutive_failures"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// Runs standing through an outage of `service` and back, then drains:
    /// returns the reference of every record produced.
    fn through_outage(&self, service: &mut dyn Outage, what: &str) -> Reference {
        let (records, reference) = windowed::records(RECORDS, PARTITIONS, SPAN_MS);
        let (before, during) = records.split_at(RECORDS / 2);
        let mut child = self
            .command(&["--metrics", &self.metrics])
            .spawn()
            .expect("starting skein");
        windowed::produce(&self.topic, before);
        let at = common::wait_until(&mut child, PATIENCE, "a first commit", || {
            committed_epoch(&self.checkpoints())
        });
        service.down();
        windowed::produce(&self.topic, during);
        let failing = common::wait_until(
            &mut child,
            PATIENCE,
            "status to show the failing sink",
            || {
                let f = self.failing_sinks();
                (!f.is_empty()).then_some(f)
            },
        );
        println!("{what}: failing sink in status: {failing:?}");
        let text = format!("{:?}", failing[0]);
        assert!(
            failing[0].last_error.is_some() && failing[0].failing_since_ms.is_some(),
            "{text}"
        );
        let gauge = common::wait_until(&mut child, PATIENCE, "the failures gauge", || {
            self.failures_gauge().filter(|g| *g > 0.0)
        });
        println!("{what}: skein_sink_consecutive_failures {gauge}");
        service.up();
        common::wait_until(&mut child, PATIENCE, "the sink to write again", || {
            let sinks = self.status().sinks;
            let recovered = !sinks.is_empty()
                && sinks
                    .iter()
                    .all(|s| s.consecutive_failures == 0 && s.last_success_ms.is_some());
            let moved = committed_epoch(&self.checkpoints()) > Some(at);
            (recovered && moved).then_some(())
        });
        common::wait_until(&mut child, PATIENCE, "the gauge back at 0", || {
            self.failures_gauge().filter(|g| *g == 0.0)
        });
        stop(child);
        // The last run takes what is left and flushes every window.
        let out = common::wait_with_timeout(
            self.command(&["--until-drained"])
                .spawn()
                .expect("draining"),
            PATIENCE,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        reference
    }
}

/// SIGTERM: the standing run commits the epoch in flight and exits 0.
fn stop(child: Child) {
    let sent = Command::new("kill")
        .args(["-s", "TERM", &child.id().to_string()])
        .status()
        .expect("running kill");
    assert!(sent.success());
    let out = common::wait_with_timeout(child, PATIENCE);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Outage for PrivateRedis {
    fn down(&mut self) {
        PrivateRedis::down(self);
    }
    fn up(&mut self) {
        PrivateRedis::up(self);
    }
}

#[test]
fn a_standing_run_shows_a_failing_redis_and_recovers_exactly_once() {
    let dir = std::env::temp_dir().join(common::unique_name("skein-private-redis"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut redis = PrivateRedis::start(common::free_port(), &dir);
    let prefix = common::unique_name("outage");
    let sink = windowed::redis_list_sink(&redis.url(), &prefix);
    let standing = Standing::new(&sink);
    let reference = standing.through_outage(&mut redis, "redis");
    windowed::assert_lists_exact(&redis.url(), &prefix, &reference, &[]);
}

impl Outage for PrivateBroker {
    fn down(&mut self) {
        self.services("stop");
    }
    fn up(&mut self) {
        self.services("start");
    }
}

#[test]
fn a_standing_run_shows_a_failing_kafka_sink_and_recovers_exactly_once() {
    let root = std::env::var_os("SKEIN_TEST_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let mut broker = PrivateBroker::start(root.join(common::unique_name("sink-outage-kafka")));
    let out = common::unique_name("outage-out");
    common::kafka::create_topic(&broker.brokers(), &out, 2);
    let sink = format!(
        "CREATE EXTERNAL TABLE out (w TIMESTAMP, k VARCHAR, n BIGINT, s BIGINT) STORED AS KAFKA \
           LOCATION '{out}' OPTIONS ('bootstrap.servers' '{}', 'format' 'json');",
        broker.brokers()
    );
    let standing = Standing::new(&sink);
    let reference = standing.through_outage(&mut broker, "kafka");
    let rows: Vec<_> = common::kafka::committed_records(&broker.brokers(), &out)
        .into_iter()
        .map(|(_, _, value)| serde_json::from_slice(&value).expect("a JSON row"))
        .collect();
    if rows.len() != reference.len() {
        // What tells a lost write from one an open transaction holds back.
        eprintln!(
            "kafka: {} rows for {} windows; per partition (id, read_committed, \
             read_uncommitted, end offset): {:?}",
            rows.len(),
            reference.len(),
            common::kafka::partition_counts(&broker.brokers(), &out)
        );
    }
    windowed::assert_exact(&rows, &reference, "kafka sink through a broker outage");
}
