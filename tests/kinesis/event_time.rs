//! Event time over Kinesis shards (ministack): one instance reading two
//! shards unevenly keeps a watermark per shard, so every 10 s window comes
//! out once and whole; `--until-drained` stops once the shards are caught up.
//!
//! Needs ministack on `AWS_ENDPOINT_URL` (default http://127.0.0.1:4566):
//! `scripts/services.sh start`.

use crate::common;

use std::collections::BTreeMap;

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;

const BASE_MS: i64 = 1_700_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_over_unevenly_read_shards_come_out_once_and_whole() {
    common::require_aws();
    let stream = common::unique_name("et-shards");
    common::create_stream(&stream, 2).await;
    let config = common::aws_sdk_config().await;
    let kinesis = aws_sdk_kinesis::Client::new(&config);
    // 2,000 records, 50 ms apart (100 s of event time), spread over both
    // shards by key, each shard in event-time order.
    let records: Vec<i64> = (0..2000).map(|i| BASE_MS + i * 50).collect();
    for chunk in records.chunks(500) {
        let entries = chunk
            .iter()
            .map(|ts| {
                PutRecordsRequestEntry::builder()
                    .partition_key(format!("key-{}", ts % 97))
                    .data(Blob::new(format!(r#"{{"ts":{ts}}}"#)))
                    .build()
                    .unwrap()
            })
            .collect();
        common::put_records(&kinesis, &stream, entries).await;
    }
    let path = std::env::temp_dir().join(format!("{}.sql", common::unique_name("et-shards")));
    // Pulls of 150 records, 75 from each shard: keys spread the records
    // unevenly, so one shard runs ahead of the other in event time.
    std::fs::write(
        &path,
        format!(
            "CREATE EXTERNAL TABLE ev (ts TIMESTAMP NOT NULL) STORED AS KINESIS LOCATION '{stream}'
               OPTIONS ('format' 'json', 'event_time' 'ts', 'max.records.per.pull' '150');
             SELECT CAST(tumble(ts, INTERVAL '10' SECOND) AS BIGINT) AS w, count(*) AS c
             FROM ev GROUP BY tumble(ts, INTERVAL '10' SECOND)"
        ),
    )
    .unwrap();
    let sql = path.display().to_string();
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        common::skein_on_aws(
            None,
            &[
                "run",
                &sql,
                "--until-drained",
                "--interval",
                "50ms",
                "--group-size",
                "2",
                "--show",
                "100",
            ],
        )
    })
    .await
    .unwrap();
    assert!(ok, "run failed:\n{stderr}");
    let mut rows: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for line in stdout.lines() {
        let cells: Vec<&str> = line
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        if let [w, c] = cells.as_slice()
            && let (Ok(w), Ok(c)) = (w.parse::<i64>(), c.parse::<i64>())
        {
            rows.entry(w).or_default().push(c);
        }
    }
    let expected: BTreeMap<i64, Vec<i64>> =
        (0..10).map(|i| (BASE_MS + i * 10_000, vec![200])).collect();
    assert_eq!(rows, expected, "one whole row per window:\n{stdout}");
    assert!(stdout.contains("2000 events"), "{stdout}");
}
