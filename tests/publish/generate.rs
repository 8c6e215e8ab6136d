//! Publishing on the real services: `skein gen` to Kafka and Kinesis, at
//! its rate and in event-time order, and bad options refused. The message
//! sinks (`INSERT INTO`) are tested in sinks.rs.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use crate::common::publish::{drain_topic, gen_report};

#[test]
fn gen_ysb_to_kafka_publishes_reference_records() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("gen-ysb");
    let to = format!("kafka://{brokers}/{topic}");
    let (ok, stdout, stderr) =
        common::skein(&["gen", "ysb", "--to", &to, "--events", "20000", "--json"]);
    assert!(ok, "skein gen failed:\n{stderr}");
    let r = gen_report(&stdout);
    assert_eq!(r.events, 20000, "{r:?}");
    let messages = drain_topic(&brokers, &topic);
    assert_eq!(messages.len(), 20000);
    let mut ads = BTreeSet::new();
    for (_, value) in &messages {
        let v: serde_json::Value = serde_json::from_slice(value).expect("a JSON record");
        for field in [
            "user_id",
            "page_id",
            "ad_id",
            "ad_type",
            "event_type",
            "ip_address",
        ] {
            assert!(v[field].is_string(), "{field} in {v}");
        }
        let t = v["event_time"].as_str().expect("event_time is a string");
        assert!(t.parse::<i64>().is_ok(), "event_time {t:?} is epoch ms");
        assert!(["view", "click", "purchase"].contains(&v["event_type"].as_str().unwrap()));
        ads.insert(v["ad_id"].as_str().unwrap().to_string());
    }
    assert_eq!(ads.len(), 1000, "100 campaigns x 10 ads");
}

#[test]
fn gen_nexmark_to_kafka_writes_one_topic_per_table_at_the_rate() {
    let brokers = common::require_kafka();
    let base = common::unique_name("gen-nx");
    let to = format!("kafka://{brokers}/{base}");
    let (ok, stdout, stderr) = common::skein(&[
        "gen", "nexmark", "--to", &to, "--events", "10000", "--rate", "20000", "--json",
    ]);
    assert!(ok, "skein gen failed:\n{stderr}");
    let r = gen_report(&stdout);
    assert_eq!(r.events, 10000, "{r:?}");
    // Paced at 20,000/s, 10,000 events take at least about half a second.
    assert!(r.elapsed_s >= 0.45, "{r:?}");
    // 1 : 3 : 46 per 50 events.
    let counts: Vec<usize> = ["person", "auction", "bid"]
        .iter()
        .map(|t| drain_topic(&brokers, &format!("{base}-{t}")).len())
        .collect();
    assert_eq!(counts, vec![200, 600, 9200]);
    let bids = drain_topic(&brokers, &format!("{base}-bid"));
    let v: serde_json::Value = serde_json::from_slice(&bids[0].1).unwrap();
    for field in [
        "auction",
        "bidder",
        "price",
        "channel",
        "url",
        "date_time",
        "extra",
    ] {
        assert!(!v[field].is_null(), "{field} in {v}");
    }
}

/// Event times of `topic`'s JSON records (`field`, a number or a string of
/// ms), by partition in offset order.
fn event_times_by_partition(brokers: &str, topic: &str, field: &str) -> BTreeMap<i32, Vec<i64>> {
    let mut out: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for (partition, _, value) in common::kafka::committed_records(brokers, topic) {
        let v: serde_json::Value = serde_json::from_slice(&value).expect("a JSON record");
        let t = match &v[field] {
            serde_json::Value::String(s) => s.parse().ok(),
            n => n.as_i64(),
        };
        let t = t.unwrap_or_else(|| panic!("{field} in {v}"));
        out.entry(partition).or_default().push(t);
    }
    out
}

/// Asserts event time never decreases within a partition, that the records
/// spread over more than one, and returns the span of event time in ms.
fn assert_ordered_per_partition(topic: &str, times: &BTreeMap<i32, Vec<i64>>) -> i64 {
    assert!(
        times.len() > 1,
        "{topic}: one partition only: {:?}",
        times.keys()
    );
    for (partition, ts) in times {
        if let Some(i) = ts.windows(2).position(|w| w[1] < w[0]) {
            panic!(
                "{topic} partition {partition}: event time goes back from {} to {} at record {}",
                ts[i],
                ts[i + 1],
                i + 1
            );
        }
    }
    let all = times.values().flatten();
    all.clone().max().unwrap() - all.min().unwrap()
}

#[test]
fn gen_writes_each_partition_in_event_time_order_at_the_event_rate() {
    let brokers = common::require_kafka();
    // Unpaced, chunks of 20,000 with up to 8 writes in flight: the chunks
    // of one topic overlap in time, and must not interleave in a partition.
    let gen_unpaced = |benchmark: &str, topic: &str, more: &[&str]| {
        let to = format!("kafka://{brokers}/{topic}");
        let mut args = vec!["gen", benchmark, "--to", &to, "--partitions", "4"];
        args.extend(["--in-flight", "8", "--json"]);
        args.extend(more);
        let (ok, stdout, stderr) = common::skein(&args);
        assert!(ok, "skein gen {benchmark} failed:\n{stderr}");
        gen_report(&stdout)
    };
    let ysb = common::unique_name("gen-order-ysb");
    let r = gen_unpaced(
        "ysb",
        &ysb,
        &["--events", "100000", "--event-rate", "10000"],
    );
    assert_eq!(r.event_rate, 10000, "{r:?}");
    let times = event_times_by_partition(&brokers, &ysb, "event_time");
    assert_eq!(times.values().map(Vec::len).sum::<usize>(), 100_000);
    // Event 99,999 at 10,000 events/s is 9,999.9 ms after event 0.
    assert_eq!(assert_ordered_per_partition(&ysb, &times), 9_999);

    let bid = common::unique_name("gen-order-bid");
    let r = gen_unpaced("nexmark", &bid, &["--table", "bid", "--events", "60000"]);
    assert_eq!(r.event_rate, 10000, "NEXMark's default: {r:?}");
    let times = event_times_by_partition(&brokers, &bid, "date_time");
    assert_eq!(times.values().map(Vec::len).sum::<usize>(), 60_000);
    // 60,000 bids are about 65,200 events: some 6.5 s at 10,000 events/s.
    let span = assert_ordered_per_partition(&bid, &times);
    assert!((6_400..=6_600).contains(&span), "span {span} ms");
}

#[test]
fn gen_refuses_a_zero_event_rate_in_one_line() {
    let (ok, stdout, stderr) = common::skein(&[
        "gen",
        "nexmark",
        "--to",
        "kafka://127.0.0.1:1/never",
        "--events",
        "10",
        "--event-rate",
        "0",
    ]);
    assert!(!ok);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr
            .trim()
            .starts_with("Error: --event-rate must be at least 1"),
        "{stderr}"
    );
}

#[tokio::test]
async fn gen_ysb_to_kinesis_puts_every_event_over_the_shards() {
    common::require_aws();
    let stream = common::unique_name("gen-ysb");
    let to = format!("kinesis://{stream}");
    // 1,234 records: three PutRecords calls of at most 500.
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        common::skein_on_aws(
            None,
            &[
                "gen",
                "ysb",
                "--to",
                &to,
                "--events",
                "1234",
                "--partitions",
                "2",
                "--json",
            ],
        )
    })
    .await
    .unwrap();
    assert!(ok, "skein gen failed:\n{stderr}");
    assert_eq!(gen_report(&stdout).events, 1234);
    let records = common::drain_stream(&stream).await;
    assert_eq!(records.len(), 1234);
    let distinct: BTreeSet<&Vec<u8>> = records.iter().map(|(_, d)| d).collect();
    assert_eq!(distinct.len(), 1234, "no record twice");
    let keys: BTreeSet<&String> = records.iter().map(|(k, _)| k).collect();
    assert!(keys.len() > 1000, "partition keys spread the records");
}
