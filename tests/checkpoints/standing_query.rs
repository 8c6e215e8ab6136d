//! Standing queries in-process: `skein run` with no bound over a Kafka
//! topic runs until SIGTERM or SIGINT, then commits the epoch in flight
//! and exits 0 without flushing its open windows. Records are produced
//! while it runs; it is stopped and restarted, and a last bounded run
//! (`--until-drained`) flushes. The sink then holds exactly the windowed
//! count and sum per key a reference computed here says.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::kills::committed_epoch;
use crate::common::rows::read_rows;
use crate::common::windowed::{self, Reference, assert_exact};
use serde_json::{Map, Value};
use skein::report::Report;
use skein_engine::epochs::Stopped;
use skein_engine::status::QueryStatus;

const PARTITIONS: usize = 4;
const RECORDS: usize = 30_000;
/// Event time the records span: the 10 s windows close 25 times.
const SPAN_MS: i64 = 250_000;
const INTERVAL: &str = "200ms";
/// Undecodable records produced before the last run, one per partition.
const BAD_RECORDS: usize = PARTITIONS;
/// A hang guard only: a stop is judged by the process exiting after the
/// signal and by what it committed, not by how long that took.
const HANG_GUARD: Duration = Duration::from_secs(300);

/// Reads back what the sink holds.
type Written = dyn Fn() -> Vec<Map<String, Value>>;

struct Standing {
    dir: PathBuf,
    sql: PathBuf,
    topic: String,
}

impl Standing {
    /// A fresh empty topic, the query from it into `sink` (a DDL of `out`).
    fn new(sink: impl FnOnce(&Path) -> String) -> Self {
        let dir = std::env::temp_dir().join(common::unique_name("skein-standing"));
        std::fs::create_dir_all(&dir).expect("a working directory");
        let (topic, source) = windowed::empty_kafka_table(PARTITIONS, 1000);
        let sql = dir.join("q.sql");
        std::fs::write(&sql, windowed::query(&source, &sink(&dir))).expect("writing the query");
        Standing { dir, sql, topic }
    }

    fn checkpoints(&self) -> PathBuf {
        self.dir.join("checkpoints")
    }

    fn command(&self, bound: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_skein"));
        c.args(["run", self.sql.to_str().expect("utf-8 path")])
            .args(bound)
            .args(["--interval", INTERVAL, "--json", "--checkpoint-dir"])
            .arg(self.checkpoints())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Start a standing run (resuming after the commit `resumes`), produce
    /// `records` while it runs, wait until it writes windows of them, check
    /// it is still running, stop it with `signal`: it exits 0 saying it was
    /// stopped by the signal, its last commit at or after the last one seen
    /// before the signal. Returns that commit.
    fn run_then_stop(
        &self,
        records: &[(usize, String)],
        signal: &str,
        written: &Written,
        resumes: Option<u64>,
    ) -> Option<u64> {
        let rows_before = written().len();
        let mut child = self.command(&[]).spawn().expect("starting skein");
        let mut at = self.wait_for_commit_after(&mut child, resumes);
        windowed::produce(&self.topic, records);
        while written().len() == rows_before {
            // Each commit without a window is one more epoch that read
            // nothing of them yet; the hang guard is the commit's.
            at = self.wait_for_commit_after(&mut child, at);
        }
        // A few more epochs: the stop may come in any of them.
        for _ in 0..3 {
            at = self.wait_for_commit_after(&mut child, at);
        }
        assert!(
            child.try_wait().expect("polling skein").is_none(),
            "a standing query keeps running without a bound"
        );
        let sent = Command::new("kill")
            .args(["-s", signal, &child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(sent.success(), "kill -s {signal}");
        let output = common::wait_with_timeout(child, HANG_GUARD);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{signal}: exit {}:\n{stderr}",
            output.status
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        let report = common::run_report(&stdout);
        assert_eq!(report.stopped, Stopped::Signal, "{report:?}");
        assert!(report.epochs > 3, "{report:?}");
        assert_eq!(
            report.resumed_after, resumes,
            "{signal}: the run resumed after the commit before it: {report:?}"
        );
        let committed = committed_epoch(&self.checkpoints());
        assert!(
            committed.is_some() && committed >= at,
            "{signal}: the stop left commit {committed:?}, before {at:?} seen while running"
        );
        committed
    }

    /// Waits until the run has committed an epoch after `after`.
    fn wait_for_commit_after(&self, child: &mut Child, after: Option<u64>) -> Option<u64> {
        let what = format!("a commit after {after:?}");
        common::wait_until(child, HANG_GUARD, &what, || {
            let now = committed_epoch(&self.checkpoints());
            (now.is_some() && now > after).then_some(now)
        })
    }

    /// The bounded last run: it takes what is left and flushes.
    fn drain(&self) -> Report {
        let child = self
            .command(&["--until-drained"])
            .spawn()
            .expect("starting skein");
        let output = common::wait_with_timeout(child, HANG_GUARD);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "the draining run failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report = common::run_report(&stdout);
        assert_eq!(report.stopped, Stopped::Bound, "{report:?}");
        report
    }

    /// Two standing runs stopped by `signals`, each taking a third of the
    /// records, then the last third and a draining run: the sink holds
    /// exactly the reference.
    fn run(&self, signals: [&str; 2], written: &Written) {
        let (records, reference) = windowed::records(RECORDS, PARTITIONS, SPAN_MS);
        let third = records.len() / 3;
        let first = self.run_then_stop(&records[..third], signals[0], written, None);
        assert_partial(&written(), &reference, "after the first stop");
        let second = self.run_then_stop(&records[third..2 * third], signals[1], written, first);
        assert_partial(&written(), &reference, "after the second stop");
        windowed::produce(&self.topic, &records[2 * third..]);
        // Records that do not decode: dropped (no dead-letter topic) and
        // counted for `skein status`.
        let bad: Vec<(usize, String)> = (0..BAD_RECORDS).map(|i| (i, "{not json".into())).collect();
        windowed::produce(&self.topic, &bad);
        let report = self.drain();
        assert_eq!(
            report.resumed_after, second,
            "the draining run resumed after the second stop's commit: {report:?}"
        );
        assert_exact(&written(), &reference, &format!("standing runs {report:?}"));
        self.assert_status_caught_up();
    }

    /// `skein status FILE --json` after the draining run: every partition
    /// committed up to its end, the last epoch committed, and the
    /// undecodable records counted once.
    fn assert_status_caught_up(&self) {
        let output = Command::new(env!("CARGO_BIN_EXE_skein"))
            .args(["status", self.sql.to_str().expect("utf-8 path"), "--json"])
            .arg("--checkpoint-dir")
            .arg(self.checkpoints())
            .output()
            .expect("running skein status");
        assert!(
            output.status.success(),
            "skein status failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let status: QueryStatus = serde_json::from_slice(&output.stdout).expect("status is JSON");
        let partitions = &status.partitions;
        assert_eq!(partitions.len(), PARTITIONS, "{status:?}");
        for p in partitions {
            assert!(p.latest.is_some_and(|l| l > 0), "{status:?}");
            assert_eq!(p.committed, p.latest, "{status:?}");
            assert_eq!(p.lag, Some(0), "{status:?}");
        }
        assert_eq!(status.lag, 0, "{status:?}");
        assert_eq!(
            status.store.committed.map(|c| c.epoch),
            status.store.last_epoch,
            "{status:?}"
        );
        assert!(status.watermark_ms.is_some(), "{status:?}");
        assert_eq!(
            status.since_start.dead_letters, BAD_RECORDS as u64,
            "{status:?}"
        );
    }
}

impl Drop for Standing {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a stopped run wrote so far: whole windows, each once and right,
/// and some of them (the windows its watermark passed).
fn assert_partial(rows: &[Map<String, Value>], reference: &Reference, what: &str) {
    let mut some = Reference::new();
    for row in rows {
        let key = (common::rows::millis(row, "w"), common::rows::text(row, "k"));
        if let Some(v) = reference.get(&key) {
            some.insert(key, *v);
        }
    }
    assert!(!some.is_empty(), "{what}: no window written yet");
    assert_exact(rows, &some, what);
}

#[test]
fn a_standing_query_stopped_by_sigterm_and_sigint_writes_files_exactly() {
    let standing = Standing::new(|dir| {
        let out = dir.join("out");
        format!(
            "CREATE EXTERNAL TABLE out (w TIMESTAMP, k VARCHAR, n BIGINT, s BIGINT) STORED AS \
               FILES LOCATION 'file://{}' OPTIONS ('format' 'json');",
            out.display()
        )
    });
    let out = standing.dir.join("out");
    standing.run(["TERM", "INT"], &move || read_rows(&out, true));
}

#[test]
fn a_standing_query_stopped_by_sigint_and_sigterm_writes_kafka_exactly() {
    let (topic, sink) = windowed::kafka_sink();
    let standing = Standing::new(|_| sink);
    standing.run(["INT", "TERM"], &move || windowed::kafka_rows(&topic));
}
