//! Dead letters on the real broker: a record too large for its letter to
//! carry whole still gets one, and the query goes on.

use crate::common;

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use skein_formats::decode::DEAD_LETTER_PREFIX_BYTES;

/// Over the broker's default message limit (about 1 MiB).
const BIG: usize = 1_500_000;

#[test]
fn an_oversized_record_gets_a_truncated_dead_letter_and_the_query_goes_on() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("big-in");
    let dead = common::unique_name("big-dead");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    // The input topic takes the large record; the dead-letter topic keeps
    // the broker's default limit, which a whole-record letter would break.
    let input =
        NewTopic::new(&topic, 1, TopicReplication::Fixed(1)).set("max.message.bytes", "4000000");
    let letters = NewTopic::new(&dead, 1, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for r in runtime
        .block_on(admin.create_topics(&[input, letters], &options))
        .unwrap()
    {
        r.unwrap();
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("message.max.bytes", "4000000")
        .create()
        .unwrap();
    let big = format!("{{\"a\": 2, \"pad\": \"{}\"}}", "x".repeat(BIG));
    // One record at a time: a retried first batch could otherwise land
    // after the large record and move it off offset 1.
    for payload in [r#"{"a": 1}"#, big.as_str(), r#"{"a": 3}"#] {
        producer
            .send(
                BaseRecord::<(), str>::to(&topic)
                    .partition(0)
                    .payload(payload),
            )
            .unwrap();
        producer.flush(Duration::from_secs(30)).unwrap();
    }

    let dir = std::env::temp_dir().join(common::unique_name("skein-dead"));
    std::fs::create_dir_all(&dir).unwrap();
    let sql = dir.join("q.sql");
    std::fs::write(
        &sql,
        format!(
            "CREATE EXTERNAL TABLE t (a BIGINT NOT NULL) STORED AS KAFKA LOCATION '{topic}' \
               OPTIONS ('bootstrap.servers' '{brokers}', 'dead.letter.topic' '{dead}');\n\
             SELECT a FROM t;\n"
        ),
    )
    .unwrap();
    let (ok, stdout, stderr) = common::skein(&[
        "run",
        sql.to_str().unwrap(),
        "--until-drained",
        "--interval",
        "50ms",
        "--json",
    ]);
    assert!(ok, "run failed:\n{stderr}");
    let report = common::run_report(&stdout);
    assert_eq!(report.result_rows, 2, "{report:?}");

    let letters = common::kafka::first_records(&brokers, &dead);
    assert_eq!(letters.len(), 1);
    let letter: serde_json::Value = serde_json::from_slice(&letters[0]).unwrap();
    assert_eq!(
        letter["topic"],
        topic.as_str(),
        "reason: {}",
        letter["reason"]
    );
    assert_eq!(letter["offset"], 1);
    assert_eq!(letter["size"], big.len());
    assert_eq!(letter["truncated"], true);
    assert!(
        letter["reason"]
            .as_str()
            .unwrap()
            .contains("exceeds the limit")
    );
    let payload = letter["payload"].as_str().unwrap();
    assert_eq!(payload.len(), DEAD_LETTER_PREFIX_BYTES);
    assert!(big.starts_with(payload));
    let _ = std::fs::remove_dir_all(dir);
}
