//! YSB with the Kafka broker stopped mid-run: `skein ysb run --until-drained`
//! is reading the topic when the broker process is stopped (SIGTERM, a
//! clean shutdown), stays down until the run has met the outage (its log),
//! and is started again with its data while the run is paused (SIGSTOP);
//! more events are written to it then, and the run goes on. The run must wait for the broker
//! rather than take the silence for a drained topic, read what was written
//! before and after, and finish with counts exact.
//!
//! The broker is this test's own: `scripts/services.sh start kafka-outage`
//! with a private state directory and free ports, so the shared broker on
//! 127.0.0.1:9092 that other tests use is never touched. It needs Java and
//! the Kafka jars (`scripts/setup.sh`) and Redis (`scripts/services.sh start
//! redis`).

use crate::common;

use crate::common::kills::Paused;
use crate::common::services::PrivateBroker;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use skein_ysb::check::CheckReport;

/// Runs `skein ysb <cmd> ... --json` against `brokers`: (ok, last line, log).
fn ysb(
    cmd: &str,
    brokers: &str,
    topic: &str,
    dir: &Path,
    seed: u64,
    extra: &[&str],
) -> (bool, Value, String) {
    common::ysb::output(&mut ysb_command(cmd, brokers, topic, dir, seed, extra))
}

fn ysb_command(
    cmd: &str,
    brokers: &str,
    topic: &str,
    dir: &Path,
    seed: u64,
    extra: &[&str],
) -> Command {
    let mut c = common::ysb::command(cmd, brokers, topic, dir, seed);
    c.args(extra);
    c
}

/// Sum of the offsets the run has committed to Redis so far.
fn committed(redis: &mut redis::Connection, topic: &str) -> i64 {
    let key = skein_sinks::redis::offsets_key(&format!("ysb:{topic}"));
    let fields: Vec<(String, i64)> = redis::cmd("HGETALL")
        .arg(&key)
        .query(redis)
        .expect("HGETALL of the stored offsets");
    fields.iter().map(|(_, o)| o).sum()
}

fn still_running(child: &mut Child, stderr: &Path, when: &str) {
    if let Some(status) = child.try_wait().expect("waiting for ysb run") {
        panic!(
            "ysb run ended ({status}) {when}; its stderr:\n{}",
            std::fs::read_to_string(stderr).unwrap_or_default()
        );
    }
}

/// truth.csv of `dir`: (campaign, window start) -> views.
fn read_truth(dir: &Path) -> BTreeMap<(String, i64), u64> {
    let path = dir.join("truth.csv");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .skip(1)
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            assert_eq!(f.len(), 3, "{}: bad line {line:?}", path.display());
            (
                (f[0].to_string(), f[1].parse().expect("window start")),
                f[2].parse().expect("views"),
            )
        })
        .collect()
}

/// Each `ysb generate` writes the truth of its own events: the topic's is
/// the sum of both.
fn write_merged_truth(dir: &Path, first: &BTreeMap<(String, i64), u64>) {
    let mut merged = read_truth(dir);
    for (k, v) in first {
        *merged.entry(k.clone()).or_insert(0) += v;
    }
    let mut text = String::from("campaign_id,window_start_ms,views\n");
    for ((c, w), v) in &merged {
        text.push_str(&format!("{c},{w},{v}\n"));
    }
    std::fs::write(dir.join("truth.csv"), text).expect("writing truth.csv");
}

#[test]
fn broker_stopped_mid_run_still_exact() {
    common::require_redis();
    let name = common::unique_name("ysb-outage");
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    // Under scripts/test.sh, in a directory its exit handler sweeps, so an
    // interrupted run leaves no broker behind.
    let state = match std::env::var_os("SKEIN_TEST_STATE") {
        Some(root) => PathBuf::from(root).join(&name),
        None => dir.join("services"),
    };
    let broker = PrivateBroker::start(state);
    let brokers = broker.brokers();
    let seed = 21;
    let (before, after) = (40_000u64, 10_000u64);

    let (ok, _, log) = ysb("setup", &brokers, &name, &dir, seed, &[]);
    assert!(ok, "ysb setup failed: {log}");
    let generate = |events: u64| {
        let (ok, generated, log) = ysb(
            "generate",
            &brokers,
            &name,
            &dir,
            seed,
            &["--events", &events.to_string()],
        );
        assert!(ok, "ysb generate failed: {log}");
        generated
    };
    let first = generate(before);
    let first_truth = read_truth(&dir);

    // At most 2 x 100 records per epoch and at least 200 ms per epoch: the
    // first 40 000 records take the run 40 s or more however fast the
    // machine, so it is still reading when the broker goes away. (The
    // consumer may well have fetched all of the first batch before the
    // stop; the second one it can only get from the restarted broker.)
    let stderr = dir.join("run.stderr");
    let mut child = ysb_command(
        "run",
        &brokers,
        &name,
        &dir,
        seed,
        &[
            "--until-drained",
            "--max-records",
            "100",
            "--interval",
            "200ms",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(std::fs::File::create(&stderr).expect("stderr file"))
    .spawn()
    .expect("starting skein ysb run");

    let mut redis = redis::Client::open(common::redis_url())
        .and_then(|c| c.get_connection())
        .expect("Redis connection");
    let deadline = Instant::now() + Duration::from_secs(180);
    while committed(&mut redis, &name) == 0 {
        still_running(&mut child, &stderr, "before its first commit");
        assert!(Instant::now() < deadline, "nothing committed after 180 s");
        std::thread::sleep(Duration::from_millis(50));
    }

    broker.services("stop");
    let at_stop = committed(&mut redis, &name);
    eprintln!("broker stopped with {at_stop} of {before} records committed");
    assert!(
        at_stop < before as i64,
        "the run was done before the broker stopped: the outage did not land mid-run"
    );
    still_running(&mut child, &stderr, "as the broker stopped");
    // The broker stays down until the run has met the outage (a failed
    // fetch or end-offset request in its log): nothing to fetch then is not
    // the end of the topic.
    let logged_before = std::fs::read_to_string(&stderr).unwrap_or_default().len();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let log = std::fs::read_to_string(&stderr).unwrap_or_default();
        let since = log.get(logged_before..).unwrap_or_default();
        if since.contains("kafka consumer:") || since.contains("retrying") {
            break;
        }
        still_running(&mut child, &stderr, "while the broker was down");
        assert!(
            Instant::now() < deadline,
            "the run logged no failed request to the stopped broker (hang guard)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    still_running(&mut child, &stderr, "while the broker was down");
    // The run may have read all of the first batch before it met the
    // outage (the consumer fetches ahead), so it would be drained as soon
    // as the broker answers. It is paused while the broker comes back and
    // the second batch is written: then it must read that batch too.
    let paused = Paused::stop(&child);
    broker.services("start");
    let second = generate(after);
    drop(paused);
    write_merged_truth(&dir, &first_truth);
    let events = before + after;

    let deadline = Instant::now() + Duration::from_secs(600);
    while child.try_wait().expect("waiting").is_none() {
        if Instant::now() > deadline {
            child.kill().ok();
            panic!("ysb run not done 600 s after the broker came back");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().expect("ysb run output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ysb run failed after the outage: {stdout}\n{}",
        std::fs::read_to_string(&stderr).unwrap_or_default()
    );
    let run: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("ysb run output {stdout:?}: {e}"));
    eprintln!("run: {run}");
    // One run read every record once, those written after the outage too:
    // nothing skipped, nothing read twice.
    assert_eq!(run["events"].as_u64(), Some(events), "{run}");

    let (ok, check, log) = ysb("check", &brokers, &name, &dir, seed, &[]);
    let check: CheckReport = common::typed(&check, &log);
    assert!(check.exact, "ysb check: {check:?} {log}");
    assert!(ok, "ysb check exited non-zero: {log}");
    assert_eq!(check.truth_exact, Some(true), "{check:?}");
    assert!(check.topic_exact, "{check:?}");
    assert_eq!(check.topic_records, events, "{check:?}");
    let views = first["views"].as_u64().unwrap() + second["views"].as_u64().unwrap();
    assert_eq!(check.views, views, "{check:?}");
    assert_eq!(committed(&mut redis, &name), events as i64);
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}
