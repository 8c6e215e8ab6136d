//! Records a format cannot decode go to the table's dead-letter topic with
//! their reason, and the others are read: Confluent-framed Avro written by
//! the serializer, with garbage, a foreign framing, a truncated record and
//! an empty one and one with a string that is not UTF-8 among them.

use super::{common, final_rows, produce, temp_dir};

const READING: &str = r#"{"type":"record","name":"Reading","namespace":"skein.tests","fields":[{"name":"sensor","type":"string"},{"name":"value","type":"long"}]}"#;

#[test]
fn undecodable_avro_records_are_dead_letters_with_reasons() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("formats-dl");
    let dlt = format!("{topic}-dead");
    let schema = temp_dir("formats-dl").join("reading.avsc");
    std::fs::write(&schema, READING).unwrap();
    let lines = [
        r#"{"sensor": "a", "value": 1}"#,
        r#"{"raw_hex": "0100000001020a"}"#,
        r#"{"sensor": "b", "value": 2}"#,
        r#"{"raw_hex": "00000000010861"}"#,
        r#"{"raw_hex": ""}"#,
        r#"{"sensor": "c", "value": -3}"#,
        // A string that is not UTF-8: found only when the batch is built.
        r#"{"raw_hex": "000000000102ff02"}"#,
        r#"{"sensor": "d", "value": 4}"#,
    ];
    produce(
        &["records", &brokers, &topic, schema.to_str().unwrap()],
        &lines.join("\n"),
    );
    let sql = format!(
        "CREATE EXTERNAL TABLE readings STORED AS KAFKA LOCATION '{topic}' OPTIONS (
           'bootstrap.servers' '{brokers}', 'format' 'avro-confluent', 'avro.schema' '{READING}',
           'dead.letter.topic' '{dlt}');
         SELECT sensor, value FROM readings"
    );
    assert_eq!(final_rows(&sql, &[]), ["a | 1", "b | 2", "c | -3", "d | 4"]);
    let letters: Vec<serde_json::Value> = common::kafka::committed_records(&brokers, &dlt)
        .into_iter()
        .map(|(_, _, v)| serde_json::from_slice(&v).unwrap())
        .collect();
    let reasons: Vec<(i64, String)> = letters
        .iter()
        .map(|l| {
            (
                l["offset"].as_i64().unwrap(),
                l["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(reasons.len(), 4, "{letters:?}");
    assert_eq!(reasons[0].0, 1);
    assert!(
        reasons[0].1.contains("not in the Confluent wire format"),
        "{reasons:?}"
    );
    assert_eq!(reasons[1].0, 3);
    assert!(reasons[1].1.contains("undecodable Avro"), "{reasons:?}");
    assert_eq!(reasons[2].0, 4);
    assert!(reasons[2].1.contains("empty record"), "{reasons:?}");
    assert_eq!(reasons[3].0, 6);
    assert!(reasons[3].1.contains("UTF-8"), "{reasons:?}");
    assert!(letters.iter().all(|l| l["topic"] == topic.as_str()));
}
