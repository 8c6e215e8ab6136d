//! The message sinks on the real services: `INSERT INTO` Kafka and
//! Kinesis tables, what Skein writes read back by Skein, delivery errors
//! reported (not swallowed), exactly-once Kafka writes, and the Kinesis
//! source's shards and dead letters.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::publish::{bids, drain_topic, write_sql};
use rdkafka::ClientConfig;

#[test]
fn insert_into_kafka_keys_rows_and_skein_reads_them_back() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("insert-kafka");
    let write = write_sql(
        "insert-kafka",
        &format!(
            "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid' OPTIONS ('events' '20000', 'partitions' '2');
             CREATE EXTERNAL TABLE out (auction BIGINT, price BIGINT, date_time TIMESTAMP)
               STORED AS KAFKA LOCATION '{topic}'
               OPTIONS ('bootstrap.servers' '{brokers}', 'key' 'auction');
             INSERT INTO out SELECT auction, price, date_time FROM bid WHERE auction % 3 = 0"
        ),
    );
    let (ok, _, stderr) = common::skein(&["run", &write, "--epochs", "3", "--json"]);
    assert!(ok, "INSERT INTO kafka failed:\n{stderr}");
    let expected: Vec<(i64, i64)> = bids(20_000)
        .into_iter()
        .filter(|(a, _)| a % 3 == 0)
        .collect();
    let messages = drain_topic(&brokers, &topic);
    assert_eq!(messages.len(), expected.len());
    let mut got = vec![];
    for (key, value) in &messages {
        let v: serde_json::Value = serde_json::from_slice(value).unwrap();
        let auction = v["auction"].as_i64().unwrap();
        assert_eq!(
            key.as_deref(),
            Some(auction.to_string().as_bytes()),
            "the key is the auction column"
        );
        assert!(v["date_time"].is_i64(), "timestamps as ms: {v}");
        got.push((auction, v["price"].as_i64().unwrap()));
    }
    got.sort();
    let mut want = expected.clone();
    want.sort();
    assert_eq!(got, want);

    // The topic read back through Skein's Kafka source.
    let read = write_sql(
        "read-kafka",
        &format!(
            "CREATE EXTERNAL TABLE bids_in (auction BIGINT, price BIGINT, date_time TIMESTAMP)
               STORED AS KAFKA LOCATION '{topic}'
               OPTIONS ('bootstrap.servers' '{brokers}', 'format' 'json');
             SELECT count(*) AS n, sum(price) AS total FROM bids_in"
        ),
    );
    let (ok, stdout, stderr) = common::skein(&["run", &read, "--epochs", "2"]);
    assert!(ok, "reading the topic back failed:\n{stderr}");
    let total: i64 = want.iter().map(|(_, p)| p).sum();
    let row = format!("| {} | {total} |", want.len());
    assert!(
        stdout
            .lines()
            .any(|l| l.split_whitespace().collect::<String>()
                == row.split_whitespace().collect::<String>()),
        "expected the row {row} in:\n{stdout}"
    );
}

#[test]
fn insert_into_kafka_reports_delivery_errors() {
    // Nothing listens on port 9: every message times out undelivered, and
    // the exactly-once default cannot even open its transactional producer.
    for delivery in ["at-least-once", "exactly-once"] {
        let topic = common::unique_name("undeliverable");
        let sql = write_sql(
            "undeliverable",
            &format!(
                "CREATE EXTERNAL TABLE person STORED AS NEXMARK LOCATION 'person' OPTIONS ('events' '500');
                 CREATE EXTERNAL TABLE out (id BIGINT, name VARCHAR) STORED AS KAFKA LOCATION '{topic}'
                   OPTIONS ('bootstrap.servers' '127.0.0.1:9', 'message.timeout.ms' '1500',
                            'delivery' '{delivery}');
                 INSERT INTO out SELECT id, name FROM person"
            ),
        );
        let (ok, _, stderr) = common::skein(&["run", &sql, "--epochs", "1"]);
        assert!(
            !ok,
            "{delivery}: a run whose rows cannot be delivered must fail"
        );
        assert!(
            stderr.contains(&format!("kafka topic {topic}")),
            "{delivery}: the error names the topic:\n{stderr}"
        );
        if delivery == "at-least-once" {
            assert!(
                stderr.contains("delivery failed"),
                "the error names the delivery failure:\n{stderr}"
            );
        }
    }
}

#[tokio::test]
async fn insert_into_kinesis_uses_the_key_column_as_partition_key() {
    common::require_aws();
    let stream = common::unique_name("insert-kinesis");
    common::create_stream(&stream, 2).await;
    let sql = write_sql(
        "insert-kinesis",
        &format!(
            "CREATE EXTERNAL TABLE person STORED AS NEXMARK LOCATION 'person' OPTIONS ('events' '50000');
             CREATE EXTERNAL TABLE people (id BIGINT, name VARCHAR, city VARCHAR)
               STORED AS KINESIS LOCATION '{stream}' OPTIONS ('key' 'id');
             INSERT INTO people SELECT id, name, city FROM person"
        ),
    );
    let (ok, _, stderr) = tokio::task::spawn_blocking(move || {
        common::skein_on_aws(None, &["run", &sql, "--epochs", "2"])
    })
    .await
    .unwrap();
    assert!(ok, "INSERT INTO kinesis failed:\n{stderr}");
    let records = common::drain_stream(&stream).await;
    // 1 person per 50 events.
    assert_eq!(records.len(), 1000);
    let mut ids = BTreeMap::new();
    for (key, data) in &records {
        let v: serde_json::Value = serde_json::from_slice(data).unwrap();
        assert_eq!(key, &v["id"].as_i64().unwrap().to_string());
        ids.insert(key.clone(), v["name"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), 1000, "every person once");
}

#[tokio::test]
async fn q10_writes_its_files_to_s3() {
    common::require_aws();
    let s3 = common::s3_client().await;
    let bucket = "skein-q10-test";
    common::ensure_bucket(&s3, bucket).await;
    let prefix = common::unique_name("q10");
    let output = format!("s3://{bucket}/{prefix}");
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        common::skein_on_aws(
            None,
            &[
                "nexmark", "--query", "10", "--events", "10000", "--epochs", "2", "--output",
                &output, "--verify", "--json",
            ],
        )
    })
    .await
    .unwrap();
    assert!(ok, "q10 to S3 failed:\n{stderr}");
    assert_eq!(common::run_report(&stdout).verified, Some(true), "{stdout}");
    let listed = s3
        .list_objects_v2()
        .bucket(bucket)
        .prefix(&prefix)
        .send()
        .await
        .unwrap_or_else(|e| panic!("ListObjectsV2: {}", common::error_chain(&e)));
    let (markers, keys): (Vec<&str>, Vec<&str>) = listed
        .contents()
        .iter()
        .filter_map(|o| o.key())
        .partition(|k| k.contains("/_skein_commits/"));
    assert!(!keys.is_empty());
    assert!(!markers.is_empty(), "each write commits with a marker");
    assert!(
        keys.iter()
            .all(|k| k.contains("/dt=2020-01-01/hm=") && k.ends_with(".json")),
        "{keys:?}"
    );
}

/// The values of the committed messages of `topic`.
fn drain_committed(brokers: &str, topic: &str) -> Vec<Vec<u8>> {
    common::kafka::committed_records(brokers, topic)
        .into_iter()
        .map(|(_, _, value)| value)
        .collect()
}

#[tokio::test]
async fn exactly_once_kafka_writes_commit_offsets_and_skip_replays() {
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use skein_engine::payload::SourceOffset;
    use skein_engine::sink::{Sink, SinkRows, SinkWrite};
    use std::sync::Arc;

    let brokers = common::require_kafka();
    let topic = common::unique_name("eo-out");
    let offsets_topic = common::unique_name("eo-offsets");
    let checkpoint = common::unique_name("cp");
    let options: BTreeMap<String, String> = [
        ("bootstrap.servers", brokers.as_str()),
        ("checkpoint", checkpoint.as_str()),
        ("offsets.topic", offsets_topic.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
    let batch = |from: i64| {
        RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from(
                (from..from + 100).collect::<Vec<_>>(),
            ))],
        )
        .unwrap()
    };
    // One run across the "restart" below: its epochs are replays. Member m
    // reads source partition m.
    let write = |epoch: u64, member: u32, from: i64, offset: i64| SinkWrite {
        query: "q",
        run: "r1",
        epoch,
        member,
        schema: schema.clone(),
        rows: SinkRows::Append(vec![batch(from)]),
        offsets: vec![SourceOffset {
            source: "input".into(),
            partition: member as i32,
            offset,
            position: None,
        }],
        last: false,
    };
    let sink = skein_sinks::kafka::KafkaSink::new(&topic, &options).unwrap();
    sink.write(write(0, 0, 0, 100)).await.unwrap();
    sink.write(write(1, 0, 100, 200)).await.unwrap();
    // The same epoch again (a re-delivery) writes nothing.
    sink.write(write(1, 0, 100, 200)).await.unwrap();
    // Another member's write of the same epoch is no replay of member 0's.
    sink.write(write(1, 1, 300, 50)).await.unwrap();
    // A new writer (a restarted engine) knows the committed epochs too.
    drop(sink);
    let sink = skein_sinks::kafka::KafkaSink::new(&topic, &options).unwrap();
    sink.write(write(1, 0, 100, 200)).await.unwrap();
    sink.write(write(1, 1, 300, 50)).await.unwrap();
    sink.write(write(2, 0, 200, 300)).await.unwrap();

    let (b, o, c) = (brokers.clone(), offsets_topic.clone(), checkpoint.clone());
    let stored = tokio::task::spawn_blocking(move || {
        skein_sinks::kafka::stored_offsets(&b, &o, &c, "input")
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(stored, [(0, 300), (1, 50)].into_iter().collect());
    let t = topic.clone();
    let values = tokio::task::spawn_blocking(move || drain_committed(&brokers, &t))
        .await
        .unwrap();
    let mut ns: Vec<i64> = values
        .iter()
        .map(|v| {
            serde_json::from_slice::<serde_json::Value>(v).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    ns.sort();
    assert_eq!(ns, (0..400).collect::<Vec<_>>(), "every row once");
}

#[tokio::test]
async fn the_kinesis_source_reads_every_shard_and_dead_letters_bad_records() {
    use aws_sdk_kinesis::primitives::Blob;
    use aws_sdk_kinesis::types::PutRecordsRequestEntry;
    use skein_generators::ysb::{YsbConfig, YsbGenerator};

    common::require_aws();
    let stream = common::unique_name("ysb-in");
    let dead = common::unique_name("ysb-dead");
    common::create_stream(&stream, 2).await;
    common::create_stream(&dead, 2).await;
    let to = format!("kinesis://{stream}");
    let (ok, _, stderr) = tokio::task::spawn_blocking(move || {
        common::skein_on_aws(
            None,
            &["gen", "ysb", "--to", &to, "--events", "3000", "--json"],
        )
    })
    .await
    .unwrap();
    assert!(ok, "skein gen failed:\n{stderr}");
    // Seven records no decoder accepts.
    let config = common::aws_sdk_config().await;
    let kinesis = aws_sdk_kinesis::Client::new(&config);
    let bad = [
        "not json",
        "{\"ad_id\": \"a\"}",
        "{\"ad_id\": 5, \"event_type\": \"view\", \"event_time\": \"1\"}",
        "{\"ad_id\": \"a\", \"event_type\": \"view\", \"event_time\": \"soon\"}",
        "{\"ad_id\": \"a\", \"event_type\": \"view\"",
        "[]",
        "",
    ];
    let entries = bad
        .iter()
        .enumerate()
        .map(|(i, b)| {
            PutRecordsRequestEntry::builder()
                .partition_key(format!("bad-{i}"))
                .data(Blob::new(if b.is_empty() {
                    b"\x00".to_vec()
                } else {
                    b.as_bytes().to_vec()
                }))
                .build()
                .unwrap()
        })
        .collect();
    common::put_records(&kinesis, &stream, entries).await;

    let sql = write_sql(
        "kinesis-source",
        &format!(
            "CREATE EXTERNAL TABLE ad_events (ad_id VARCHAR NOT NULL, event_type VARCHAR NOT NULL, event_time TIMESTAMP NOT NULL)
               STORED AS KINESIS LOCATION '{stream}'
               OPTIONS ('format' 'json', 'parallelism' '2', 'dead.letter.stream' '{dead}');
             SELECT event_type, count(*) AS n FROM ad_events GROUP BY event_type ORDER BY event_type"
        ),
    );
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        common::skein_on_aws(None, &["run", &sql, "--epochs", "2"])
    })
    .await
    .unwrap();
    assert!(ok, "reading the stream failed:\n{stderr}");
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    let mut generator = YsbGenerator::new(YsbConfig {
        max_events: Some(3000),
        ..YsbConfig::default()
    })
    .unwrap();
    while let Some(ev) = generator.next_event() {
        *expected.entry(ev.event_type.to_string()).or_default() += 1;
    }
    for (event_type, n) in &expected {
        let row = format!("|{event_type}|{n}|");
        assert!(
            stdout.lines().any(|l| l.replace(' ', "") == row),
            "expected the row {row} in:\n{stdout}"
        );
    }
    let letters = common::drain_stream(&dead).await;
    assert_eq!(
        letters.len(),
        bad.len(),
        "every bad record dead-lettered once"
    );
    for (_, data) in &letters {
        let v: serde_json::Value = serde_json::from_slice(data).unwrap();
        assert_eq!(v["stream"], stream.as_str());
        assert!(!v["reason"].as_str().unwrap().is_empty(), "{v}");
        assert!(
            v["sequence_number"].is_string() && v["shard"].is_string(),
            "{v}"
        );
    }
}

#[test]
fn kafka_to_kafka_exactly_once_resumes_where_the_sink_committed() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let brokers = common::require_kafka();
    let input = common::unique_name("eo-in");
    let output = common::unique_name("eo-out");
    let offsets_topic = common::unique_name("eo-offsets");
    let checkpoint = common::unique_name("eo-cp");
    let admin_created = common::skein(&[
        "gen",
        "ysb",
        "--to",
        &format!("kafka://{brokers}/{input}"),
        "--events",
        "0",
        "--partitions",
        "2",
    ]);
    assert!(
        admin_created.0,
        "creating the input topic: {}",
        admin_created.2
    );
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    for n in 0..3000 {
        let value = format!("{{\"n\": {n}}}");
        producer
            .send(
                BaseRecord::<(), _>::to(&input)
                    .partition(n % 2)
                    .payload(&value),
            )
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();

    let sql = write_sql(
        "eo-kafka",
        &format!(
            "CREATE EXTERNAL TABLE numbers (n BIGINT NOT NULL) STORED AS KAFKA LOCATION '{input}'
               OPTIONS ('bootstrap.servers' '{brokers}', 'startup' 'checkpoint', 'parallelism' '2',
                        'max.records.per.pull' '400');
             CREATE EXTERNAL TABLE evens (n BIGINT) STORED AS KAFKA LOCATION '{output}'
               OPTIONS ('bootstrap.servers' '{brokers}', 'checkpoint' '{checkpoint}',
                        'offsets.topic' '{offsets_topic}');
             INSERT INTO evens SELECT n FROM numbers WHERE n % 2 = 0"
        ),
    );
    // Two epochs of at most 400 records per instance: part of the input.
    let (ok, _, stderr) = common::skein(&["run", &sql, "--epochs", "2"]);
    assert!(ok, "first run failed:\n{stderr}");
    let after_first = drain_committed(&brokers, &output).len();
    assert!(
        after_first > 0 && after_first < 1500,
        "the first run wrote part of the evens: {after_first}"
    );
    // The second run resumes from the committed offsets and finishes.
    let (ok, _, stderr) = common::skein(&["run", &sql, "--epochs", "4"]);
    assert!(ok, "second run failed:\n{stderr}");
    let values = drain_committed(&brokers, &output);
    let mut ns: Vec<i64> = values
        .iter()
        .map(|v| {
            serde_json::from_slice::<serde_json::Value>(v).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    ns.sort();
    assert_eq!(
        ns,
        (0..3000).filter(|n| n % 2 == 0).collect::<Vec<i64>>(),
        "every even number once across the two runs"
    );
}
