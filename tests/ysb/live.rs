//! YSB as YSB runs it, on the real Kafka and Redis, through the `skein`
//! binary:
//!
//! * `skein gen ysb` and `ysb setup` agree by default, and the campaign map
//!   is YSB's own layout (`SET <ad> <campaign>`, `SADD campaigns`);
//! * views of an ad without a campaign go to the dead-letter topic with
//!   their reason while the rest is counted exactly;
//! * `ysb check` without a ground-truth file, on a topic still being written;
//! * `ysb bench --rate --duration` reports window latencies and exactness.
//!
//! Redis outages are tested in tests/ysb/redis_outage.rs.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::Value;
use skein::r#gen::GenReport;
use skein_ysb::bench::LatencyBench;
use skein_ysb::check::CheckReport;

/// `skein <args> --json`: (success, last stdout line as JSON, log).
fn skein_json(args: &[&str]) -> (bool, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(args)
        .arg("--json")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("running skein");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let last = stdout.lines().last().unwrap_or_default();
    let json = serde_json::from_str(last).unwrap_or(Value::Null);
    (
        out.status.success(),
        json,
        format!(
            "stdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `ysb <cmd>` on `topic` with the shared services, default seed.
fn ysb_args<'a>(cmd: &'a str, topic: &'a str, dir: &'a Path, extra: &[&'a str]) -> Vec<String> {
    let mut v: Vec<String> = ["ysb", cmd, "--topic", topic, "--dir"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.push(dir.display().to_string());
    v.extend([
        "--brokers".to_string(),
        common::kafka_brokers(),
        "--redis".to_string(),
        common::redis_url(),
    ]);
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn ysb(cmd: &str, topic: &str, dir: &Path, extra: &[&str]) -> (bool, Value, String) {
    let args = ysb_args(cmd, topic, dir, extra);
    skein_json(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Kafka and Redis are up; a fresh topic name and a directory for it.
fn fresh(prefix: &str) -> (String, std::path::PathBuf) {
    common::require_kafka();
    common::require_redis();
    let topic = common::unique_name(prefix);
    let dir = tempdir(&topic);
    (topic, dir)
}

/// Records of `topic` (all partitions) up to the end, as JSON values.
fn letters(topic: &str) -> Vec<Value> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Message, Offset, TopicPartitionList};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .set("group.id", common::unique_name("ysb-letters"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let (_, high) = consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .expect("watermarks of the dead-letter topic");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut out = vec![];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while (out.len() as i64) < high && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            out.push(
                serde_json::from_slice(m.payload().unwrap_or_default()).unwrap_or(Value::Null),
            );
        }
    }
    out
}

#[test]
fn gen_and_setup_agree_and_unknown_ads_become_dead_letters() {
    let (topic, dir) = fresh("ysb-unknown-ad");
    // Default seeds on both sides: the events' ads have campaigns. (The only
    // test on the default seed: campaigns' result hashes are shared keys.)
    let (ok, _, log) = ysb("setup", &topic, &dir, &[]);
    assert!(ok, "ysb setup: {log}");

    // Redis holds YSB's layout: SET <ad> <campaign>, SADD campaigns <campaign>.
    let mapping = std::fs::read_to_string(dir.join("ad-to-campaign-ids.txt")).expect("mapping");
    let line: serde_json::Map<String, Value> =
        serde_json::from_str(mapping.lines().next().expect("a mapping line")).expect("JSON");
    let (ad, campaign) = line.iter().next().expect("ad and campaign");
    let (ad, campaign) = (ad.as_str(), campaign.as_str().expect("a campaign id"));
    let mut con = redis::Client::open(common::redis_url())
        .and_then(|c| c.get_connection())
        .expect("Redis");
    let got: Option<String> = redis::cmd("GET").arg(ad).query(&mut con).unwrap();
    assert_eq!(got.as_deref(), Some(campaign), "GET {ad}");
    let member: bool = redis::cmd("SISMEMBER")
        .arg("campaigns")
        .arg(campaign)
        .query(&mut con)
        .unwrap();
    assert!(member, "campaign {campaign} in the set campaigns");

    let to = format!("kafka://{}/{topic}", common::kafka_brokers());
    let (ok, generated, log) = skein_json(&["gen", "ysb", "--to", &to, "--events", "20000"]);
    assert!(ok, "gen ysb: {log}");
    let generated: GenReport = common::typed(&generated, &log);
    assert_eq!(generated.events, 20_000, "{generated:?}");
    // A few views of ads nobody set up.
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .create()
        .expect("producer");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    for i in 0..5 {
        let event = format!(
            r#"{{"user_id": "u", "page_id": "p", "ad_id": "no-such-ad-{}", "ad_type": "banner", "event_type": "view", "event_time": "{now}", "ip_address": "1.2.3.4"}}"#,
            i % 2
        );
        producer
            .send(
                BaseRecord::<(), _>::to(&topic)
                    .partition(i % 4)
                    .payload(&event),
            )
            .expect("enqueue");
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let (ok, run, log) = ysb("run", &topic, &dir, &["--until-drained"]);
    assert!(ok, "ysb run must go on past unknown ads: {log}");
    assert_eq!(run["events"].as_u64(), Some(20_005), "{run}");
    assert_eq!(run["unknown_ad_views"].as_u64(), Some(5), "{run}");

    // No ground truth in a fresh directory: checked against the topic.
    let fresh = tempdir(&format!("{topic}-check"));
    let (ok, check, log) = ysb("check", &topic, &fresh, &[]);
    assert!(ok, "ysb check: {check} {log}");
    let check: CheckReport = common::typed(&check, &log);
    assert!(check.exact, "{check:?}");
    assert_eq!(check.truth_exact, None, "{check:?}");
    assert_eq!(check.topic_unknown_ad_views, 5, "{check:?}");
    assert_eq!(check.dead_letter_unknown_ad_views, 5, "{check:?}");
    assert_eq!(check.topic_records, 20_005, "{check:?}");

    // One letter per view, from the lookup join with `campaigns`.
    let dlt = format!("{topic}-dead-letters");
    let unknown: Vec<Value> = letters(&dlt)
        .into_iter()
        .filter(|l| {
            l["row"]["ad_id"]
                .as_str()
                .is_some_and(|a| a.starts_with("no-such-ad"))
        })
        .collect();
    assert_eq!(unknown.len(), 5, "{unknown:?}");
    for l in &unknown {
        let reason = l["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("no row in lookup table campaigns for ad_id"),
            "{l}"
        );
        assert_eq!(l["table"].as_str(), Some("ad_events"), "{l}");
        // The row as the join sees it: the columns the query goes on to use.
        assert!(l["row"]["event_time"].is_string(), "{l}");
        let to = l["offsets_to"].as_object().expect("offsets_to");
        assert!(
            to.keys().all(|k| k.starts_with(&format!("{topic}:"))),
            "{l}"
        );
    }
}

/// The sum of the committed offsets of the YSB query over `topic`: the
/// records it has committed, read from the sink's offsets hash in Redis.
fn committed_offsets(topic: &str, redis: &mut redis::Connection) -> i64 {
    let key = skein_sinks::redis::offsets_key(&format!("ysb:{topic}"));
    let offsets: Vec<i64> = redis::cmd("HVALS")
        .arg(&key)
        .query(redis)
        .expect("HVALS of the offsets hash");
    offsets.iter().sum()
}

#[test]
fn check_without_ground_truth_on_a_live_topic() {
    let (topic, dir) = fresh("ysb-live-check");
    let (ok, _, log) = ysb("setup", &topic, &dir, &["--seed", "41"]);
    assert!(ok, "ysb setup: {log}");
    let to = format!("kafka://{}/{topic}", common::kafka_brokers());
    // Neither the query nor the producer ends on its own during the test
    // (their hour is a hang guard): both are stopped once the check ran.
    let args = ysb_args(
        "run",
        &topic,
        &dir,
        &["--duration", "60m", "--seed", "41", "--json"],
    );
    let mut run = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ysb run");
    let mut load = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args([
            "gen",
            "ysb",
            "--to",
            &to,
            "--rate",
            "2000",
            "--duration",
            "60m",
            "--seed",
            "41",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gen ysb");
    let mut redis = redis::Client::open(common::redis_url())
        .and_then(|c| c.get_connection())
        .expect("Redis connection");
    common::wait_until(
        &mut run,
        Duration::from_secs(300),
        "a commit of records from the live topic",
        || (committed_offsets(&topic, &mut redis) > 0).then_some(()),
    );
    // Mid-run: the producer and the query are both still going.
    let (ok, check, log) = ysb("check", &topic, &dir, &["--seed", "41"]);
    for (what, child) in [("the producer", &mut load), ("the query", &mut run)] {
        assert!(
            child.try_wait().expect("polling").is_none(),
            "{what} ended during the check"
        );
    }
    assert!(ok, "ysb check on a live topic: {check} {log}");
    let check: CheckReport = common::typed(&check, &log);
    assert!(check.exact, "{check:?}");
    assert_eq!(check.truth_exact, None, "{check:?}");
    assert!(check.committed_records > 0, "{check:?}");
    // Both stopped: the producer's last records are in the topic or not at
    // all, and the query resumes from its last commit.
    for (what, child) in [("the producer", &mut load), ("the query", &mut run)] {
        let (landed, status) = common::kills::sigkill(child);
        assert!(landed, "{what} was still running when killed ({status})");
    }
    let (ok, drained, log) = ysb("run", &topic, &dir, &["--seed", "41", "--until-drained"]);
    assert!(ok, "the draining ysb run: {drained} {log}");
    // Once drained, everything in the topic is counted.
    let (ok, check, log) = ysb("check", &topic, &dir, &["--seed", "41"]);
    assert!(ok, "ysb check after the run: {check} {log}");
    let check: CheckReport = common::typed(&check, &log);
    assert!(check.exact, "{check:?}");
    assert!(check.topic_records > 0, "{check:?}");
    assert_eq!(
        u64::try_from(check.committed_records).ok(),
        Some(check.topic_records),
        "{check:?}"
    );
}

#[test]
fn bench_at_a_rate_reports_window_latencies() {
    let (topic, dir) = fresh("ysb-bench-rate");
    let (ok, bench, log) = ysb(
        "bench",
        &topic,
        &dir,
        &["--rate", "5000", "--duration", "10s", "--seed", "42"],
    );
    assert!(ok, "ysb bench: {log}");
    // The names as printed; the figures are read from the typed report.
    for k in [
        "latency_ms_p50",
        "latency_ms_p90",
        "latency_ms_p99",
        "latency_ms_max",
    ] {
        assert!(bench[k].is_i64(), "{k}: {bench}");
    }
    let bench: LatencyBench = common::typed(&bench, &log);
    assert!(bench.exact, "{bench:?}");
    assert!(bench.windows > 0, "{bench:?}");
    assert!(bench.latency_ms_p50 <= bench.latency_ms_p99, "{bench:?}");
    // How many events a loaded machine publishes in 10 s is a benchmark's
    // figure (`skein ysb bench`), not this test's: never more than the rate
    // allows, and every one read.
    let events = bench.events;
    assert!((1..=55_000).contains(&events), "{bench:?}");
    assert_eq!(bench.events_read, events, "{bench:?}");
    assert!(bench.achieved_events_per_s > 0.0, "{bench:?}");
}
