//! A pushed Kinesis table feeding a tumbling aggregate, on ministack with
//! the real `skein-function` binary: every pushed batch is an epoch of the
//! offsets log, the windowed counts land in S3 once each, and a poison
//! record (undecodable, no dead-letter stream) is reported in
//! `batchItemFailures` and recorded with the query's dead letters while
//! the rest of the shard is counted.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::windowed::{self, BASE_MS, WINDOW_MS};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use serde_json::{Map, Value};

async fn keys(s3: &aws_sdk_s3::Client, bucket: &str, prefix: &str) -> Vec<String> {
    let mut out = vec![];
    let mut token = None;
    loop {
        let page = s3
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .set_continuation_token(token)
            .send()
            .await
            .unwrap_or_else(|e| panic!("ListObjectsV2: {}", common::error_chain(&e)));
        out.extend(
            page.contents()
                .iter()
                .filter_map(|o| o.key())
                .map(String::from),
        );
        token = page.next_continuation_token().map(String::from);
        if token.is_none() {
            return out;
        }
    }
}

/// The JSON rows of the committed writes under `prefix` (the objects the
/// files sink's commit markers list).
async fn committed_rows(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    prefix: &str,
) -> Vec<Map<String, Value>> {
    let mut committed = BTreeSet::new();
    for marker in keys(s3, bucket, prefix)
        .await
        .into_iter()
        .filter(|k| k.contains("/_skein_commits/"))
    {
        let listed = String::from_utf8(common::pushed::object(s3, bucket, &marker).await).unwrap();
        committed.extend(listed.lines().map(str::to_string));
    }
    let mut rows = vec![];
    for key in &committed {
        let body = common::pushed::object(s3, bucket, key).await;
        for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            rows.push(serde_json::from_slice(line).unwrap());
        }
    }
    rows
}

fn entry(data: &str, key: &str) -> PutRecordsRequestEntry {
    PutRecordsRequestEntry::builder()
        .data(Blob::new(data.as_bytes().to_vec()))
        .partition_key(key)
        .build()
        .unwrap()
}

#[tokio::test]
async fn pushed_batches_feed_a_tumbling_aggregate_exactly_once_past_a_poison_record() {
    common::require_aws();
    let config = common::aws_sdk_config().await;
    let kinesis = aws_sdk_kinesis::Client::new(&config);
    let s3 = common::s3_client().await;
    let bucket = "skein-push-windows";
    common::ensure_bucket(&s3, bucket).await;
    let store = format!("s3://{bucket}/{}", common::unique_name("store"));
    let stream = common::unique_name("push-win");
    common::create_stream(&stream, 1).await;
    let prefix = common::unique_name("counts");

    let source = format!(
        "CREATE EXTERNAL TABLE ev (k VARCHAR NOT NULL, v BIGINT NOT NULL, ts TIMESTAMP NOT NULL) \
         STORED AS KINESIS LOCATION '{stream}' \
         OPTIONS ('format' 'json', 'mode' 'push', 'event_time' 'ts', 'idle.timeout' '1h');"
    );
    let sink = format!(
        "CREATE EXTERNAL TABLE out (w TIMESTAMP, k VARCHAR, n BIGINT, s BIGINT) \
         STORED AS FILES LOCATION 's3://{bucket}/{prefix}' OPTIONS ('format' 'json');"
    );
    let sql = std::env::temp_dir().join(format!("{}.sql", common::unique_name("pushwin")));
    std::fs::write(&sql, windowed::query(&source, &sink)).unwrap();
    let sql = sql.display().to_string();

    let deployed = common::pushed::deploy(&store, &sql).await;
    let query = deployed["query_code"].as_str().unwrap().to_string();

    // 1,500 records over 60 s of event time, put in rounds so they arrive
    // in several batches; a poison record in the middle of the second
    // round; then a record far ahead that closes every window before it.
    let (records, reference) = windowed::records(1500, 1, 60_000);
    for (round, chunk) in records.chunks(300).enumerate() {
        let mut entries: Vec<_> = chunk.iter().map(|(_, r)| entry(r, "k")).collect();
        if round == 1 {
            entries.insert(150, entry("{not json", "k"));
        }
        common::put_records(&kinesis, &stream, entries).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let closer = format!(
        r#"{{"k":"closer","v":0,"ts":{}}}"#,
        BASE_MS + 100 * WINDOW_MS
    );
    common::put_records(&kinesis, &stream, vec![entry(&closer, "k")]).await;

    let rows = common::within(180, "every window's count in S3", async {
        loop {
            let rows = committed_rows(&s3, bucket, &prefix).await;
            if rows.len() >= reference.len() {
                break rows;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    windowed::assert_exact(&rows, &reference, "pushed windows");

    // The poison record was reported and recorded, with its reason.
    // The dead letters live at the store bucket's root, per query.
    let letters = keys(&s3, bucket, &format!("skein/dead-letters/{query}/")).await;
    let poison: Vec<_> = letters.iter().filter(|k| k.contains("-poison-")).collect();
    assert_eq!(poison.len(), 1, "one poison letter: {letters:?}");
    let letter: Value =
        serde_json::from_slice(&common::pushed::object(&s3, bucket, poison[0]).await).unwrap();
    assert!(
        letter["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{letter}"
    );

    // The function's own answer to the mapping names the poison record in
    // `batchItemFailures`: a batch of one poison record, after every real
    // one, sent as the mapping sends it.
    let function = deployed["event_source_mappings"][0]["function"]
        .as_str()
        .expect("the mapping's function")
        .to_string();
    let seq = "59999999999999999999999999999999999999999999999999999999";
    let event = serde_json::json!({"Records": [{
        "eventSource": "aws:kinesis",
        "eventID": format!("shardId-000000000000:{seq}"),
        "kinesis": {"sequenceNumber": seq, "partitionKey": "k",
                    // base64 of `{not json`
                    "data": "e25vdCBqc29u"}
    }]});
    let lambda = aws_sdk_lambda::Client::new(&config);
    let answer = lambda
        .invoke()
        .function_name(&function)
        .payload(aws_sdk_lambda::primitives::Blob::new(event.to_string()))
        .send()
        .await
        .unwrap_or_else(|e| panic!("Invoke: {}", common::error_chain(&e)));
    let answer: Value =
        serde_json::from_slice(answer.payload().expect("an answer").as_ref()).unwrap();
    assert_eq!(
        answer["batchItemFailures"],
        serde_json::json!([{ "itemIdentifier": seq }]),
        "{answer}"
    );

    let (ok, _, stderr) = tokio::task::spawn_blocking({
        let (store, sql) = (store.clone(), sql.clone());
        move || common::skein_on_aws(Some(&store), &["destroy", &sql])
    })
    .await
    .unwrap();
    assert!(ok, "destroy failed:\n{stderr}");
}
