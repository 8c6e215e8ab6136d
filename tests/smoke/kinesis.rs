//! Kinesis smoke test: aws-sdk-kinesis puts records on a fresh 2-shard stream
//! of ministack and reads all of them back, shard by shard.

use crate::common;

use std::collections::BTreeSet;

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ShardIteratorType};

const SHARDS: i32 = 2;
const RECORDS: usize = 40;

#[tokio::test]
async fn kinesis_put_get_on_two_shards() {
    let config = common::aws_sdk_config().await;
    let kinesis = aws_sdk_kinesis::Client::new(&config);
    let stream = common::unique_name("skein-smoke");

    common::create_stream(&stream, SHARDS).await;

    let sent: BTreeSet<String> = (0..RECORDS).map(|i| format!("record-{i}")).collect();
    let entries = sent
        .iter()
        .map(|data| {
            PutRecordsRequestEntry::builder()
                .partition_key(data) // distinct keys hash to both shards
                .data(Blob::new(data.as_bytes()))
                .build()
                .expect("entry")
        })
        .collect();
    common::put_records(&kinesis, &stream, entries).await;

    let shards = kinesis
        .list_shards()
        .stream_name(&stream)
        .send()
        .await
        .unwrap_or_else(|e| panic!("ListShards: {}", common::error_chain(&e)));
    assert_eq!(shards.shards().len(), SHARDS as usize);

    let mut received = BTreeSet::new();
    let mut shards_with_data = 0;
    for shard in shards.shards() {
        let iterator = kinesis
            .get_shard_iterator()
            .stream_name(&stream)
            .shard_id(shard.shard_id())
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GetShardIterator: {}", common::error_chain(&e)))
            .shard_iterator
            .expect("a shard iterator");
        // Follow the shard until a read comes back empty: one read need not return all.
        let mut next = Some(iterator);
        let mut reads = 0;
        while let Some(iterator) = next.take() {
            reads += 1;
            assert!(
                reads <= 20,
                "shard {} did not drain in 20 reads",
                shard.shard_id()
            );
            let page = kinesis
                .get_records()
                .shard_iterator(iterator)
                .limit(1000)
                .send()
                .await
                .unwrap_or_else(|e| panic!("GetRecords: {}", common::error_chain(&e)));
            if page.records().is_empty() {
                break;
            }
            if reads == 1 {
                shards_with_data += 1;
            }
            for record in page.records() {
                received.insert(String::from_utf8_lossy(record.data().as_ref()).into_owned());
            }
            next = page.next_shard_iterator;
        }
    }
    assert_eq!(received, sent, "records read back differ from those put");
    assert_eq!(
        shards_with_data, SHARDS,
        "records should spread over both shards"
    );

    if let Err(e) = kinesis.delete_stream().stream_name(&stream).send().await {
        eprintln!(
            "note: could not delete stream {stream}: {}",
            common::error_chain(&e)
        );
    }
}
