//! The formats on Kinesis: the Avro records the Confluent serializer wrote
//! for the NEXMark bids, put on a Kinesis stream byte for byte, read by a
//! `STORED AS KINESIS` table, add up to what the JSON bids add up to.

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;

use super::nexmark::{schemas_dir, topic, totals_sql};
use super::{common, final_rows};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_bids_on_kinesis_add_up_to_the_json_ones() {
    common::require_aws();
    let (brokers, avro_topic) = tokio::task::spawn_blocking(|| topic("avro", "bid"))
        .await
        .unwrap();
    let records = common::kafka::committed_records(&brokers, &avro_topic);
    let stream = common::unique_name("formats-kinesis");
    common::create_stream(&stream, 2).await;
    let kinesis = aws_sdk_kinesis::Client::new(&common::aws_sdk_config().await);
    for chunk in records.chunks(500) {
        let entries = chunk
            .iter()
            .map(|(partition, _, value)| {
                PutRecordsRequestEntry::builder()
                    .partition_key(format!("p{partition}"))
                    .data(Blob::new(value.clone()))
                    .build()
                    .unwrap()
            })
            .collect();
        common::put_records(&kinesis, &stream, entries).await;
    }
    let schema = schemas_dir().join("bid.avsc");
    let table = format!(
        "CREATE EXTERNAL TABLE bid STORED AS KINESIS LOCATION '{stream}'
           OPTIONS ('format' 'avro-confluent', 'avro.schema' '{}');",
        schema.display()
    );
    let path = std::env::temp_dir().join(format!("{stream}.sql"));
    std::fs::write(&path, format!("{table}\n{}", totals_sql())).unwrap();
    let sql = path.display().to_string();
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        common::skein_on_aws(
            None,
            &["run", &sql, "--until-drained", "--interval", "50ms"],
        )
    })
    .await
    .unwrap();
    assert!(ok, "run failed:\n{stderr}");
    let json = tokio::task::spawn_blocking(|| {
        let (brokers, json_topic) = topic("json", "bid");
        let table = format!(
            "CREATE EXTERNAL TABLE bid ({}) STORED AS KAFKA LOCATION '{json_topic}'
               OPTIONS ('bootstrap.servers' '{brokers}', 'format' 'json');",
            super::nexmark::columns("bid")
        );
        final_rows(&format!("{table}\n{}", totals_sql()), &[])
    })
    .await
    .unwrap();
    assert_eq!(json.len(), 1);
    let expected = format!("| {} |", json[0]);
    assert!(
        stdout
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == expected.split_whitespace().collect::<Vec<_>>()),
        "Kinesis printed\n{stdout}\nnot the JSON totals {expected}"
    );
}
