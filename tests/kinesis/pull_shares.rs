//! A Kinesis source with a small pull budget over a backlog in several
//! shards: one pull takes a share of every shard, rather than the whole
//! budget from the first shard it visits (which left the others, and so
//! event time, standing still until the first was caught up).
//!
//! Needs ministack on `AWS_ENDPOINT_URL` (default http://127.0.0.1:4566):
//! `scripts/services.sh start`.

use crate::common;

use std::collections::BTreeMap;

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;

const SHARDS: i64 = 3;
const PER_SHARD: i64 = 1_000;
const BUDGET: i64 = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_small_pull_takes_a_share_of_every_shard() {
    common::require_aws();
    let stream = common::unique_name("pull-shares");
    common::create_stream(&stream, SHARDS as i32).await;
    let config = common::aws_sdk_config().await;
    let kinesis = aws_sdk_kinesis::Client::new(&config);
    let listed = kinesis
        .list_shards()
        .stream_name(&stream)
        .send()
        .await
        .expect("ListShards");
    let starts: Vec<String> = listed
        .shards()
        .iter()
        .map(|s| s.hash_key_range().unwrap().starting_hash_key().to_string())
        .collect();
    assert_eq!(starts.len(), SHARDS as usize, "{listed:?}");
    // Each record says which shard it was put to: `s`.
    for (s, start) in starts.iter().enumerate() {
        for chunk in (0..PER_SHARD).collect::<Vec<_>>().chunks(500) {
            let entries = chunk
                .iter()
                .map(|n| {
                    PutRecordsRequestEntry::builder()
                        .partition_key(format!("k{n}"))
                        .explicit_hash_key(start)
                        .data(Blob::new(format!(r#"{{"s":{s},"n":{n}}}"#)))
                        .build()
                        .unwrap()
                })
                .collect();
            common::put_records(&kinesis, &stream, entries).await;
        }
    }
    let path = std::env::temp_dir().join(format!("{stream}.sql"));
    std::fs::write(
        &path,
        format!(
            "CREATE EXTERNAL TABLE ev (s BIGINT NOT NULL, n BIGINT NOT NULL) STORED AS KINESIS \
               LOCATION '{stream}' OPTIONS ('format' 'json', 'max.records.per.pull' '{BUDGET}', \
               'parallelism' '1');
             SELECT s, count(*) AS c FROM ev GROUP BY s"
        ),
    )
    .unwrap();
    let sql = path.display().to_string();
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        common::skein_on_aws(None, &["run", &sql, "--epochs", "1", "--no-checkpoint"])
    })
    .await
    .unwrap();
    assert!(ok, "skein run failed:\n{stdout}\n{stderr}");
    // The table of the result: `| s | c |` rows.
    let counts: BTreeMap<i64, i64> = stdout
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line
                .split('|')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect();
            match cells[..] {
                [s, c] => Some((s.parse().ok()?, c.parse().ok()?)),
                _ => None,
            }
        })
        .collect();
    let total: i64 = counts.values().sum();
    assert_eq!(
        total, BUDGET,
        "one pull of {BUDGET} records: {counts:?}\n{stdout}"
    );
    assert_eq!(
        counts.len(),
        SHARDS as usize,
        "the pull read shards {counts:?} of {SHARDS}\n{stdout}"
    );
    for (s, c) in &counts {
        assert!(
            *c >= BUDGET / SHARDS / 2,
            "shard {s} gave {c} of the pull's {BUDGET}: {counts:?}"
        );
    }
}
