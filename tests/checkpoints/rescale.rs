//! Changing a group's size while a standing query runs (`skein rescale`):
//! a windowed count and sum per key, and an aggregate without a window,
//! read a 4-partition Kafka topic that records are produced into while the
//! query runs; the stateful group is rescaled by hand to random sizes at
//! random moments, once with a SIGKILL right after the request, and the
//! sink then holds exactly what a reference computed here says. Each size
//! asked for shows in `skein status --json` once carried out. With
//! `--autoscale` the group sizes itself: down when idle, up under a
//! backlog, and down again once it has caught up.

use crate::common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::kills::{Paused, committed_epoch, wait_for_commit};
use crate::common::redis_counts;
use crate::common::rows::read_rows;
use crate::common::windowed::{self, assert_exact, per_key_into_redis, totals};
use rand::{Rng, SeedableRng};
use serde_json::Value;

const PARTITIONS: usize = 4;
const RECORDS: usize = 40_000;
/// Event time the records span: the 10 s windows close 25 times.
const SPAN_MS: i64 = 250_000;
/// Rescales asked for; the kill comes right after the one numbered KILL_AT.
const RESCALES: usize = 5;
const KILL_AT: usize = 2;
/// A hang guard only; every wait is for a condition.
const HANG_GUARD: Duration = Duration::from_secs(300);

struct Query {
    dir: PathBuf,
    sql: PathBuf,
    /// Every run started, killed when the test ends (a failed one too).
    started: std::sync::Mutex<Vec<u32>>,
}

impl Query {
    fn new(text: String) -> Self {
        let dir = std::env::temp_dir().join(common::unique_name("skein-rescale"));
        std::fs::create_dir_all(&dir).expect("a working directory");
        let sql = dir.join("q.sql");
        std::fs::write(&sql, text).expect("writing the query");
        Query {
            dir,
            sql,
            started: Default::default(),
        }
    }

    fn checkpoints(&self) -> PathBuf {
        self.dir.join("checkpoints")
    }

    fn skein(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_skein"));
        c.args(args)
            .arg(self.sql.to_str().expect("utf-8 path"))
            .arg("--checkpoint-dir")
            .arg(self.checkpoints());
        c
    }

    /// A standing run: an epoch every 50 ms, each committed.
    fn spawn(&self) -> Child {
        self.spawn_with(&["--interval", "50ms"])
    }

    /// A standing run with `args`, each epoch committed.
    fn spawn_with(&self, args: &[&str]) -> Child {
        let child = self
            .skein(&["run"])
            .args(args)
            .args(["--checkpoint-interval", "1", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting skein");
        self.started.lock().expect("not poisoned").push(child.id());
        child
    }

    fn status(&self) -> Value {
        let out = self
            .skein(&["status"])
            .arg("--json")
            .output()
            .expect("skein status");
        assert!(
            out.status.success(),
            "skein status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    fn rescale(&self, stage: u64, members: u32) {
        let out = self
            .skein(&["rescale"])
            .args([
                "--stage",
                &stage.to_string(),
                "--group-size",
                &members.to_string(),
            ])
            .output()
            .expect("skein rescale");
        assert!(
            out.status.success(),
            "skein rescale: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The one stateful group's stage id and its size now.
    fn group(&self) -> (u64, u32) {
        let status = self.status();
        let groups = status["groups"].as_object().expect("groups in status");
        let (stage, members) = groups.iter().next_back().expect("a function group");
        (
            stage.parse().expect("a stage id"),
            members.as_u64().expect("a size") as u32,
        )
    }

    /// `pid` was reaped: its id may be another process's from now on.
    fn reaped(&self, pid: u32) {
        self.started
            .lock()
            .expect("not poisoned")
            .retain(|p| *p != pid);
    }

    /// Stops a standing run with SIGTERM: it exits 0.
    fn stop(&self, child: Child) {
        let pid = child.id();
        let sent = Command::new("kill")
            .args(["-s", "TERM", &child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(sent.success());
        let out = common::wait_with_timeout(child, HANG_GUARD);
        self.reaped(pid);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Query {
    fn drop(&mut self) {
        for pid in self.started.lock().map(|p| p.clone()).unwrap_or_default() {
            // Only runs not reaped are listed: a failed test's, still going.
            let _ = Command::new("kill")
                .args(["-9", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `query` standing while `chunks` are produced, one before each of
/// [`RESCALES`] rescales to a random size; after the one numbered
/// [`KILL_AT`] the process is SIGKILLed at once and started again. Every
/// size shows in status once carried out. Returns the running child.
fn rescale_while_running(query: &Query, mut produce: impl FnMut(usize)) -> Child {
    let seed: u64 = rand::random();
    eprintln!("rescale seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut child = query.spawn();
    produce(0);
    wait_for_commit(&mut child, &query.checkpoints(), 1);
    let (stage, mut size) = query.group();
    let mut sizes = vec![size];
    for round in 0..RESCALES {
        produce(round + 1);
        let wanted = loop {
            let m = rng.random_range(1..=8u32);
            if m != size {
                break m;
            }
        };
        // A few epochs in, at a random moment.
        let at = committed_epoch(&query.checkpoints()).unwrap_or(0) + rng.random_range(1..4);
        wait_for_commit(&mut child, &query.checkpoints(), at);
        query.rescale(stage, wanted);
        if round == KILL_AT {
            // Before the driver carried it out, or while it did, or just
            // after: a restart resumes on one side of it.
            std::thread::sleep(Duration::from_millis(rng.random_range(0..120)));
            child.kill().expect("SIGKILL");
            child.wait().expect("reaping skein");
            query.reaped(child.id());
            child = query.spawn();
        }
        let started = Instant::now();
        loop {
            let status = query.status();
            let now = status["groups"][stage.to_string()].as_u64();
            if now == Some(u64::from(wanted)) && status["rescale_asked"].is_null() {
                break;
            }
            assert!(
                started.elapsed() < HANG_GUARD,
                "stage {stage} never reached {wanted} members: {status}"
            );
            still_running(&mut child, &format!("during a rescale to {wanted}"));
            std::thread::sleep(Duration::from_millis(50));
        }
        // It runs, and commits, at the new size.
        let c = committed_epoch(&query.checkpoints()).expect("a commit");
        wait_for_commit(&mut child, &query.checkpoints(), c + 2);
        size = wanted;
        sizes.push(size);
    }
    eprintln!("stage {stage} sizes {sizes:?}");
    child
}

/// Fails with its stderr if the run has exited.
fn still_running(child: &mut Child, when: &str) {
    if let Some(exit) = child.try_wait().expect("waiting for skein") {
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        panic!("skein exited ({exit}) {when}:\n{stderr}");
    }
}

/// The records of `chunk` of RESCALES + 1 (in event-time order).
fn chunk_of<T: Clone>(records: &[T], chunk: usize) -> Vec<T> {
    let per = records.len().div_ceil(RESCALES + 1);
    records
        .iter()
        .skip(chunk * per)
        .take(per)
        .cloned()
        .collect()
}

#[test]
fn a_windowed_query_rescaled_by_hand_while_it_runs_writes_every_window_exactly() {
    let (records, reference) = windowed::records(RECORDS, PARTITIONS, SPAN_MS);
    let (topic, source) = windowed::empty_kafka_table(PARTITIONS, 500);
    let out_dir = std::env::temp_dir().join(common::unique_name("skein-rescale-out"));
    std::fs::create_dir_all(&out_dir).expect("an output directory");
    let query = Query::new(windowed::query(&source, &windowed::files_sink(&out_dir)));
    let child = rescale_while_running(&query, |chunk| {
        windowed::produce(&topic, &chunk_of(&records, chunk));
    });
    query.stop(child);
    // The last run flushes the windows still open, at the size committed.
    let out = query
        .skein(&["run"])
        .args(["--until-drained", "--interval", "10ms", "--json"])
        .output()
        .expect("the last run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_exact(&read_rows(&out_dir, true), &reference, "after rescales");
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn an_updating_aggregate_rescaled_by_hand_while_it_runs_keeps_every_keys_row_exact() {
    common::require_redis();
    let (records, _) = windowed::records(RECORDS, PARTITIONS, SPAN_MS);
    let (topic, source) = windowed::empty_kafka_table(PARTITIONS, 500);
    let prefix = common::unique_name("rescale");
    let query = Query::new(per_key_into_redis(&source, &prefix, "count(*)"));
    let child = rescale_while_running(&query, |chunk| {
        windowed::produce(&topic, &chunk_of(&records, chunk));
    });
    // Standing: the result is in the sink while the query runs.
    let reference = totals(&records);
    let started = Instant::now();
    while redis_counts(&prefix) != reference {
        assert!(
            started.elapsed() < HANG_GUARD,
            "the sink never held the reference: {:?}",
            redis_counts(&prefix)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    query.stop(child);
    assert_eq!(redis_counts(&prefix), reference, "after the stop");
}

/// The size of `stage` in status, once it satisfies `wanted`, with every
/// size seen on the way; fails if the run exits.
fn wait_for_size(
    query: &Query,
    child: &mut Child,
    stage: u64,
    what: &str,
    wanted: impl Fn(u32) -> bool,
    seen: &mut Vec<u32>,
) -> u32 {
    let started = Instant::now();
    loop {
        let status = query.status();
        if let Some(now) = status["groups"][stage.to_string()].as_u64() {
            let now = now as u32;
            if seen.last() != Some(&now) {
                seen.push(now);
            }
            if wanted(now) {
                return now;
            }
        }
        assert!(
            started.elapsed() < HANG_GUARD,
            "stage {stage} never got {what} (sizes seen {seen:?}): {status}"
        );
        still_running(child, &format!("waiting for {what}"));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn autoscale_shrinks_an_idle_group_grows_it_under_a_backlog_and_keeps_every_key_exact() {
    common::require_redis();
    // count(DISTINCT) of values that never repeat: the sources cannot
    // pre-aggregate it, so the groups do the work. Large pulls: in this
    // (debug) build a backlog gives a member many times half of the 100 ms
    // interval per epoch, and idle epochs a few milliseconds.
    let records = windowed::records(300_000, PARTITIONS, SPAN_MS).0;
    let (topic, source) = windowed::empty_kafka_table(PARTITIONS, 25_000);
    let prefix = common::unique_name("autoscale");
    let query = Query::new(per_key_into_redis(&source, &prefix, "count(DISTINCT v)"));
    let mut child = query.spawn_with(&[
        "--interval",
        "100ms",
        "--group-size",
        "4",
        "--autoscale",
        "1..4",
    ]);
    wait_for_commit(&mut child, &query.checkpoints(), 1);
    let (stage, planned) = query.group();
    assert_eq!(planned, 4, "planned at --group-size 4");
    let mut seen = vec![planned];
    // Idle: nothing to do, so one member.
    wait_for_size(
        &query,
        &mut child,
        stage,
        "1 member when idle",
        |m| m == 1,
        &mut seen,
    );
    // The run is paused while the backlog is written, so that it meets all
    // of it at once rather than keeping up with the producer.
    let paused = Paused::stop(&child);
    windowed::produce(&topic, &records);
    drop(paused);
    let grown = wait_for_size(
        &query,
        &mut child,
        stage,
        "more members under the backlog",
        |m| m > 1,
        &mut seen,
    );
    // Caught up, and idle again.
    let reference = totals(&records);
    let started = Instant::now();
    while redis_counts(&prefix) != reference {
        assert!(
            started.elapsed() < HANG_GUARD,
            "the sink never held the reference (sizes seen {seen:?})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_for_size(
        &query,
        &mut child,
        stage,
        "1 member once caught up",
        |m| m == 1,
        &mut seen,
    );
    eprintln!("stage {stage} sizes {seen:?} (grew to {grown})");
    // Status keeps the history: down, up, down again.
    let status = query.status();
    let mut history: Vec<u64> = status["resized"]
        .as_array()
        .expect("resized in status")
        .iter()
        .filter_map(|r| r["groups"][stage.to_string()].as_u64())
        .collect();
    history.dedup();
    let down = history.iter().position(|m| *m == 1);
    let up = down.and_then(|d| history[d..].iter().position(|m| *m > 1).map(|u| d + u));
    let again = up.and_then(|u| history[u..].iter().position(|m| *m == 1));
    assert!(
        again.is_some(),
        "status's rescales of stage {stage} are not down, up, down: {history:?}"
    );
    query.stop(child);
    assert_eq!(redis_counts(&prefix), reference, "after the stop");
}
