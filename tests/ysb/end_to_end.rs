//! YSB end to end on the real Kafka and Redis, through the `skein` binary:
//! `ysb setup`, `ysb generate`, `ysb run`, `ysb check`.
//!
//! * exact counts for 1 000 000 events;
//! * 1% malformed records: exact counts for the good ones, every bad one in
//!   the dead-letter topic with its reason, exactly once;
//! * `ysb run` (default group size) killed with SIGKILL four times, at
//!   moments tied to its commits, and restarted from its checkpoint
//!   directory: the counts are still exact and every bad record has a dead
//!   letter (a replayed epoch may send one again, under the same key);
//! * `--duration` keeps pulling after an empty epoch while a producer
//!   writes, and `--metrics` serves what it reads and checkpoints meanwhile.
//!
//! The check (`skein_ysb::check`, called directly; `ysb check` once, as a
//! command) compares Redis with the ground truth file and with counts it
//! recomputes from the topic, and the dead-letter topic with the topic's
//! undecodable records. The broker outage test is tests/ysb/kafka_outage.rs.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::Value;
use skein_cost::CostReport;
use skein_ysb::Workload;
use skein_ysb::check::{CheckReport, check_report};

/// `skein ysb <cmd> --json` on the shared services.
fn ysb_command(cmd: &str, topic: &str, dir: &Path, seed: u64) -> Command {
    common::ysb::command(cmd, &common::kafka_brokers(), topic, dir, seed)
}

/// Runs `skein ysb <cmd> <args> --json`; returns the last stdout line as JSON.
fn ysb(cmd: &str, topic: &str, dir: &Path, seed: u64, extra: &[&str]) -> (bool, Value, String) {
    common::ysb::output(ysb_command(cmd, topic, dir, seed).args(extra))
}

/// A hang guard only: each wait below has its own condition.
const HANG_GUARD: Duration = Duration::from_secs(300);

fn require_services() {
    common::require_kafka();
    common::require_redis();
}

fn prepare(topic: &str, dir: &Path, seed: u64, events: u64, extra: &[&str]) -> Value {
    let (ok, _, log) = ysb("setup", topic, dir, seed, &[]);
    assert!(ok, "ysb setup failed: {log}");
    let events = events.to_string();
    let mut args = vec!["--events", events.as_str()];
    args.extend_from_slice(extra);
    let (ok, generated, log) = ysb("generate", topic, dir, seed, &args);
    assert!(ok, "ysb generate failed: {log}");
    generated
}

/// The check `ysb check` makes, called in the library: Redis matches the
/// ground truth and the counts recomputed from the topic, and the dead
/// letters match the topic's bad records.
fn assert_exact(topic: &str, dir: &Path, seed: u64, expected_views: u64) -> CheckReport {
    let workload = Workload {
        brokers: common::kafka_brokers(),
        redis: common::redis_url(),
        topic: topic.to_string(),
        seed,
        dir: dir.to_path_buf(),
    };
    let check = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(check_report(&workload))
        .unwrap_or_else(|e| panic!("checking {topic}: {e}"));
    assert!(check.exact, "{check:?}");
    assert_eq!(check.truth_exact, Some(true), "{check:?}");
    assert!(check.topic_exact, "{check:?}");
    assert!(check.dead_letters_exact, "{check:?}");
    assert_eq!(check.views, expected_views, "{check:?}");
    assert_eq!(check.topic_views, expected_views, "{check:?}");
    assert_eq!((check.missing, check.extra), (0, 0), "{check:?}");
    assert_eq!(
        (check.topic_missing, check.topic_extra),
        (0, 0),
        "{check:?}"
    );
    check
}

/// `skein ysb check` itself: exits zero and says `exact` in its JSON line.
fn assert_cli_check_exact(topic: &str, dir: &Path, seed: u64, expected_views: u64) {
    let (ok, check, log) = ysb("check", topic, dir, seed, &[]);
    let check: CheckReport = common::typed(&check, &log);
    assert!(check.exact, "ysb check: {check:?} {log}");
    assert!(ok, "ysb check exited non-zero: {log}");
    assert_eq!(check.views, expected_views, "{check:?}");
}

/// Every record of `topic` from the beginning up to the high watermarks
/// taken now: (partition, offset, payload).
fn read_whole_topic(topic: &str) -> Vec<(i32, i64, Vec<u8>)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .set("group.id", common::unique_name("ysb-read"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("metadata of {topic}: {e}"));
    let mut ends = std::collections::BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in metadata.topics()[0].partitions() {
        let (low, high) = consumer
            .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
            .expect("watermarks");
        if low < high {
            ends.insert(p.id(), high);
            tpl.add_partition_offset(topic, p.id(), Offset::Offset(low))
                .unwrap();
        }
    }
    let mut out = vec![];
    if ends.is_empty() {
        return out;
    }
    consumer.assign(&tpl).expect("assign");
    let deadline = Instant::now() + HANG_GUARD;
    while !ends.is_empty() {
        assert!(
            Instant::now() < deadline,
            "reading {topic}: partitions {ends:?} not read to their end (hang guard)"
        );
        let Some(m) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let m = m.expect("consuming");
        let (p, off) = (m.partition(), m.offset());
        if ends.get(&p).is_some_and(|high| off < *high) {
            out.push((p, off, m.payload().unwrap_or_default().to_vec()));
        }
        if ends.get(&p).is_some_and(|high| off + 1 >= *high) {
            ends.remove(&p);
        }
    }
    out
}

#[test]
fn ysb_counts_are_exact() {
    require_services();
    let topic = common::unique_name("ysb-exact");
    let dir = tempdir(&topic);
    let seed = 11;
    // 1 000 000 events at 50 000/s of event time: 20 windows per campaign.
    let generated = prepare(&topic, &dir, seed, 1_000_000, &["--rate", "50000"]);
    let (ok, run, log) = ysb("run", &topic, &dir, seed, &["--until-drained"]);
    assert!(ok, "ysb run failed: {log}");
    assert_eq!(run["events"].as_u64(), Some(1_000_000), "{run}");
    assert_cli_check_exact(&topic, &dir, seed, generated["views"].as_u64().unwrap());
    // A second run finds nothing new and changes nothing.
    let (ok, again, log) = ysb("run", &topic, &dir, seed, &["--until-drained"]);
    assert!(ok, "second ysb run failed: {log}");
    assert_eq!(again["events"].as_u64(), Some(0), "{again}");
    assert_exact(&topic, &dir, seed, generated["views"].as_u64().unwrap());
}

#[test]
fn malformed_events_go_to_the_dead_letter_topic() {
    require_services();
    let topic = common::unique_name("ysb-malformed");
    let dead = format!("{topic}-dead-letters");
    let dir = tempdir(&topic);
    let seed = 12;
    let generated = prepare(&topic, &dir, seed, 50_000, &["--malformed-percent", "1"]);
    let malformed = generated["malformed"].as_u64().unwrap();
    assert_eq!(malformed, 500, "{generated}");
    let (ok, run, log) = ysb(
        "run",
        &topic,
        &dir,
        seed,
        &["--until-drained", "--dead-letter-topic", &dead],
    );
    assert!(ok, "ysb run failed: {log}");
    assert_eq!(run["dead_letters"].as_u64(), Some(malformed), "{run}");

    // Every bad record is in the dead-letter topic, once, with its reason:
    // `ysb check` matches the letters with the records it cannot decode...
    let check = assert_exact(&topic, &dir, seed, generated["views"].as_u64().unwrap());
    assert_eq!(check.topic_malformed, malformed, "{check:?}");
    assert_eq!(check.dead_letters, malformed, "{check:?}");
    assert_eq!(check.dead_letter_duplicates, 0, "{check:?}");
    // ... and read here, every letter names a distinct record of the topic.
    let letters = read_whole_topic(&dead);
    let mut seen = BTreeSet::new();
    for (_, _, payload) in &letters {
        let letter: Value = serde_json::from_slice(payload).expect("a dead letter is JSON");
        assert_eq!(letter["topic"].as_str(), Some(topic.as_str()), "{letter}");
        assert!(
            !letter["reason"].as_str().unwrap_or_default().is_empty(),
            "dead letter without a reason: {letter}"
        );
        let key = (
            letter["partition"].as_i64().unwrap(),
            letter["offset"].as_i64().unwrap(),
        );
        assert!(seen.insert(key), "dead letter {key:?} twice");
    }
    assert_eq!(letters.len() as u64, malformed, "dead letters found");
}

#[test]
fn killed_at_commits_and_restarted_still_exact() {
    require_services();
    let topic = common::unique_name("ysb-kill");
    let dir = tempdir(&topic);
    let checkpoints = dir.join("checkpoints");
    let seed = 13;
    let generated = prepare(
        &topic,
        &dir,
        seed,
        200_000,
        &["--rate", "20000", "--malformed-percent", "1"],
    );
    let malformed = generated["malformed"].as_u64().unwrap();
    assert_eq!(malformed, 2_000, "{generated}");
    // The default group size (several sink members, each with its own epoch
    // marker). Small pulls and at least 100 ms per epoch: a whole run takes
    // 34 epochs, over 3 s however fast the machine, so the kills land mid-way.
    let run = || {
        let mut c = ysb_command("run", &topic, &dir, seed);
        c.arg("--checkpoint-dir")
            .arg(&checkpoints)
            .args(["--until-drained", "--max-records", "3000"])
            .args(["--interval", "100ms"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let kills = common::kills::run_through_kills(run, &checkpoints, 4);
    assert!(
        kills.mid_run() >= 2,
        "the late kills cut runs after a commit: {:?}",
        kills.kills
    );
    // `ysb run --json` prints an object of its own (src/ysb/run.rs).
    let run: Value = kills.assert_resumed();
    eprintln!("final run: {run}");
    assert!(
        run["functions"].as_u64() > Some(3),
        "the default group size: {run}"
    );
    // The kills interrupted the work: the last run went on from a commit.
    assert!(run["resumed_after"].is_u64(), "{run}");
    assert!(run["resumed_from"].as_i64() > Some(0), "{run}");
    let check = assert_exact(&topic, &dir, seed, generated["views"].as_u64().unwrap());
    // Each bad record has its letter; an epoch replayed after a kill may
    // have sent some again, with the same key.
    assert_eq!(check.dead_letters, malformed, "{check:?}");
    eprintln!(
        "dead letters sent again by replayed epochs: {}",
        check.dead_letter_duplicates
    );
}

#[test]
fn duration_run_keeps_pulling_while_a_producer_writes() {
    require_services();
    let topic = common::unique_name("ysb-live");
    let dir = tempdir(&topic);
    let seed = 14;
    // The topic exists and is empty when the run starts.
    let empty = prepare(&topic, &dir, seed, 0, &[]);
    assert_eq!(empty["events"].as_u64(), Some(0), "{empty}");
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let child = ysb_command("run", &topic, &dir, seed)
        .args(["--duration", "25s", "--metrics", &metrics])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting skein ysb run");
    // The first epoch found nothing and committed offset 0 of each of the 4
    // partitions: from here on an engine that stops at an empty epoch is done.
    let key = skein_sinks::redis::offsets_key(&format!("ysb:{topic}"));
    let mut redis = redis::Client::open(common::redis_url())
        .and_then(|c| c.get_connection())
        .expect("Redis connection");
    let mut child = child;
    common::wait_until(
        &mut child,
        HANG_GUARD,
        "the first (empty) epoch's commit",
        || {
            let fields: i64 = redis::cmd("HLEN")
                .arg(&key)
                .query(&mut redis)
                .expect("HLEN");
            (fields == 4).then_some(())
        },
    );
    // Now a producer writes, while the run goes on.
    let generated = prepare_events(&topic, &dir, seed, 50_000);
    // Scraped while it runs: what it read (some of the records written
    // after its empty epochs), and its checkpoint writes (the commit
    // follows the sink's write at the run's checkpoint cadence).
    let names = [
        "skein_source_records_total",
        "skein_checkpoint_write_seconds_bucket",
        "skein_commit_duration_seconds_bucket",
        "skein_checkpoint_written_bytes_total",
    ];
    common::wait_until(
        &mut child,
        HANG_GUARD,
        "metrics of records read after the empty epochs",
        || {
            let body = common::scrape(&metrics)?;
            let read: f64 = body
                .lines()
                .filter(|l| l.starts_with("skein_source_records_total"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            (names.iter().all(|n| body.contains(n)) && read > 0.0).then_some(())
        },
    );
    let out = common::wait_with_timeout(child, HANG_GUARD);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ysb run failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("ysb run output {stdout:?}: {e}"));
    assert!(run["events"].as_u64() > Some(0), "{run}");
    let cost: CostReport = common::typed(&run["cost"], &stdout);
    assert!(
        cost.lambda.first().map(|l| l.usd_per_million_events) > Some(0.0),
        "{run}"
    );
    // What its duration left unread, a run to the end of the topic takes:
    // how much that is depends on the machine, the sum does not.
    let (ok, drained, log) = ysb("run", &topic, &dir, seed, &["--until-drained"]);
    assert!(ok, "the draining ysb run failed: {log}");
    assert!(drained["resumed_after"].is_u64(), "{drained}");
    assert_exact(&topic, &dir, seed, generated["views"].as_u64().unwrap());
}

/// `ysb generate --events N` alone (no setup, which would clear the offsets).
fn prepare_events(topic: &str, dir: &Path, seed: u64, events: u64) -> Value {
    let events = events.to_string();
    let (ok, generated, log) = ysb("generate", topic, dir, seed, &["--events", &events]);
    assert!(ok, "ysb generate failed: {log}");
    generated
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
