//! Kinesis pushed by a Lambda event-source mapping, on ministack: `skein
//! deploy` maps a `'mode' 'push'` stream to the query's source function (the
//! real `skein-function` binary), records put on the stream arrive in the
//! function in batches, and the function's stage writes them to S3 files.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use skein_generators::ysb::{YsbConfig, YsbGenerator};

/// Every JSON row of the committed writes under `prefix` of `bucket` (the
/// objects the files sink's commit markers list): (ad_id, count of rows).
async fn rows_in(s3: &aws_sdk_s3::Client, bucket: &str, prefix: &str) -> BTreeMap<String, u64> {
    let listed = s3
        .list_objects_v2()
        .bucket(bucket)
        .prefix(prefix)
        .send()
        .await
        .unwrap_or_else(|e| panic!("ListObjectsV2: {}", common::error_chain(&e)));
    let mut committed = std::collections::BTreeSet::new();
    for marker in listed
        .contents()
        .iter()
        .filter_map(|o| o.key())
        .filter(|k| k.contains("/_skein_commits/"))
    {
        let keys = String::from_utf8(common::pushed::object(s3, bucket, marker).await).unwrap();
        committed.extend(keys.lines().map(str::to_string));
    }
    let mut out = BTreeMap::new();
    for key in &committed {
        let body = common::pushed::object(s3, bucket, key).await;
        for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(line).unwrap();
            *out.entry(v["ad_id"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
    }
    out
}

#[tokio::test]
async fn an_event_source_mapping_pushes_kinesis_batches_through_the_function() {
    common::require_aws();
    let config = common::aws_sdk_config().await;
    let lambda = aws_sdk_lambda::Client::new(&config);
    let s3 = common::s3_client().await;
    let bucket = "skein-push-test";
    common::ensure_bucket(&s3, bucket).await;
    let store = format!("s3://{bucket}/store");
    let stream = common::unique_name("push-in");
    common::create_stream(&stream, 2).await;
    let prefix = common::unique_name("views");

    let sql = std::env::temp_dir().join(format!("{}.sql", common::unique_name("push")));
    std::fs::write(
        &sql,
        format!(
            "CREATE EXTERNAL TABLE ad_events (ad_id VARCHAR NOT NULL, event_type VARCHAR NOT NULL, event_time TIMESTAMP NOT NULL)
               STORED AS KINESIS LOCATION '{stream}' OPTIONS ('format' 'json', 'mode' 'push');
             CREATE EXTERNAL TABLE views (ad_id VARCHAR, event_time TIMESTAMP)
               STORED AS FILES LOCATION 's3://{bucket}/{prefix}' OPTIONS ('format' 'json');
             INSERT INTO views SELECT ad_id, event_time FROM ad_events WHERE event_type = 'view'"
        ),
    )
    .unwrap();
    let sql = sql.display().to_string();

    let deployed = common::pushed::deploy(&store, &sql).await;
    let mappings = deployed["event_source_mappings"]
        .as_array()
        .expect("mappings listed");
    assert_eq!(mappings.len(), 1, "{deployed}");
    let function = mappings[0]["function"].as_str().unwrap().to_string();

    // 4,000 events; the views among them must land in S3, each once.
    let to = format!("kinesis://{stream}");
    let (ok, _, stderr) = tokio::task::spawn_blocking({
        let store = store.clone();
        move || {
            common::skein_on_aws(
                Some(&store),
                &["gen", "ysb", "--to", &to, "--events", "4000"],
            )
        }
    })
    .await
    .unwrap();
    assert!(ok, "gen failed:\n{stderr}");
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    let mut generator = YsbGenerator::new(YsbConfig {
        max_events: Some(4000),
        ..YsbConfig::default()
    })
    .unwrap();
    while let Some(ev) = generator.next_event() {
        if ev.is_view() {
            *expected.entry(ev.ad_id.to_string()).or_default() += 1;
        }
    }
    let want: u64 = expected.values().sum();
    let got = common::within(120, "the views arriving in S3", async {
        loop {
            let got = rows_in(&s3, bucket, &prefix).await;
            if got.values().sum::<u64>() >= want {
                break got;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    assert_eq!(got, expected, "every view once, nothing else");

    let (ok, _, stderr) = tokio::task::spawn_blocking({
        let (store, sql) = (store.clone(), sql.clone());
        move || common::skein_on_aws(Some(&store), &["destroy", &sql])
    })
    .await
    .unwrap();
    assert!(ok, "destroy failed:\n{stderr}");
    // Every mapping, not the function's: asking by a deleted function's name
    // may be an error, and an error must not read as "no mappings".
    let all = lambda
        .list_event_source_mappings()
        .send()
        .await
        .unwrap_or_else(|e| panic!("listing mappings: {}", common::error_chain(&e)));
    let left: Vec<_> = all
        .event_source_mappings()
        .iter()
        .filter(|m| {
            m.function_arn()
                .is_some_and(|arn| arn.ends_with(&format!(":{function}")))
        })
        .collect();
    assert!(left.is_empty(), "destroy removes the mapping: {left:?}");
}
