//! YSB end to end on the real Kafka and Redis, through the `skein` binary:
//! `ysb setup`, `ysb generate`, `ysb run`, `ysb check`.
//!
//! * exact counts for 1 000 000 events;
//! * 1% malformed records: exact counts for the good ones, every bad one in
//!   the dead-letter topic with its reason;
//! * the engine killed with SIGKILL three times mid-run and restarted: the
//!   counts are still exact (the offsets are committed with the results).

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::Value;

/// Runs `skein ysb <cmd> <args> --json`; returns the last stdout line as JSON.
fn ysb(cmd: &str, topic: &str, dir: &Path, seed: u64, extra: &[&str]) -> (bool, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args([
            "ysb",
            cmd,
            "--topic",
            topic,
            "--seed",
            &seed.to_string(),
            "--json",
        ])
        .arg("--dir")
        .arg(dir)
        .args([
            "--brokers",
            &common::kafka_brokers(),
            "--redis",
            &common::redis_url(),
        ])
        .args(extra)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("running skein");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let last = stdout.lines().last().unwrap_or_default();
    let json = serde_json::from_str(last).unwrap_or(Value::Null);
    (
        out.status.success(),
        json,
        format!("stdout: {stdout}\nstderr: {stderr}"),
    )
}

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

fn assert_exact(topic: &str, dir: &Path, seed: u64, expected_views: u64) {
    let (ok, check, log) = ysb("check", topic, dir, seed, &[]);
    assert_eq!(
        check["exact"],
        Value::Bool(true),
        "ysb check: {check} {log}"
    );
    assert!(ok, "ysb check exited non-zero: {log}");
    assert_eq!(check["views"].as_u64(), Some(expected_views), "{check}");
    assert_eq!(check["missing"].as_u64(), Some(0));
    assert_eq!(check["extra"].as_u64(), Some(0));
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
    assert_exact(&topic, &dir, seed, generated["views"].as_u64().unwrap());
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
    assert_exact(&topic, &dir, seed, generated["views"].as_u64().unwrap());

    // Every bad record is in the dead-letter topic, once, with its reason.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .set("group.id", common::unique_name("ysb-dlt"))
        .create()
        .expect("consumer");
    let metadata = consumer
        .fetch_metadata(Some(&dead), Duration::from_secs(10))
        .expect("dead-letter topic metadata");
    let mut tpl = TopicPartitionList::new();
    for p in metadata.topics()[0].partitions() {
        tpl.add_partition_offset(&dead, p.id(), Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).expect("assign");
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while (seen.len() as u64) < malformed && Instant::now() < deadline {
        let Some(m) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let m = m.expect("consuming dead letters");
        let letter: Value =
            serde_json::from_slice(m.payload().unwrap_or_default()).expect("a dead letter is JSON");
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
    assert_eq!(seen.len() as u64, malformed, "dead letters found");
}

#[test]
fn killed_three_times_still_exact() {
    require_services();
    let topic = common::unique_name("ysb-kill");
    let dir = tempdir(&topic);
    let seed = 13;
    let generated = prepare(&topic, &dir, seed, 200_000, &["--rate", "20000"]);
    // Small pulls, so that the run lasts long enough to be killed mid-way.
    let slow = [
        "--until-drained",
        "--max-records",
        "3000",
        "--interval",
        "50ms",
    ];
    let mut rng = rand::random::<u64>();
    for round in 0..3 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
            .args([
                "ysb",
                "run",
                "--topic",
                &topic,
                "--seed",
                &seed.to_string(),
                "--json",
            ])
            .arg("--dir")
            .arg(&dir)
            .args([
                "--brokers",
                &common::kafka_brokers(),
                "--redis",
                &common::redis_url(),
            ])
            .args(slow)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting skein ysb run");
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let after = Duration::from_millis(800 + (rng >> 33) % 1500);
        std::thread::sleep(after);
        // Child::kill sends SIGKILL: no chance to flush or clean up.
        let exited = child.try_wait().expect("waiting").is_some();
        child.kill().ok();
        child.wait().ok();
        eprintln!("round {round}: killed after {after:?} (had exited already: {exited})");
    }
    let (ok, run, log) = ysb("run", &topic, &dir, seed, &["--until-drained"]);
    assert!(ok, "final ysb run failed: {log}");
    eprintln!("final run: {run}");
    // The kills interrupted the work: some was done before, some was left.
    let resumed = run["resumed_from"].as_i64().unwrap_or_default();
    assert!(
        resumed > 0 && resumed < 200_000,
        "the kills did not land mid-run: {run}"
    );
    assert_exact(&topic, &dir, seed, generated["views"].as_u64().unwrap());
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
