//! A Kinesis stream resharded while a windowed count runs over it (ministack):
//! records put before a split, between the split and a merge, and after the
//! merge are each counted once, through a SIGKILL and a resume across the
//! split.
//!
//! ministack drops a split or merged parent at once (real Kinesis keeps it
//! readable until its retention ends), so the test reshards only once the
//! run has committed every record put so far: what is checked is that the
//! reader picks up the children, that resumes start them right, and that
//! no record is lost or counted twice.
//!
//! Needs ministack on `AWS_ENDPOINT_URL` (default http://127.0.0.1:4566):
//! `scripts/services.sh start ministack`.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::rows::read_rows;
use crate::common::windowed;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use skein_engine::status::QueryStatus;

/// Puts `records` (JSON) with spread partition keys; returns the last
/// sequence number put per shard number.
async fn put(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    records: &[(usize, String)],
) -> BTreeMap<i64, String> {
    let mut last = BTreeMap::new();
    for (c, chunk) in records.chunks(500).enumerate() {
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(i, (_, json))| {
                PutRecordsRequestEntry::builder()
                    .partition_key(format!("p{}-{i}", c))
                    .data(Blob::new(json.clone()))
                    .build()
                    .expect("a record")
            })
            .collect();
        let out = common::put_records(kinesis, stream, entries).await;
        for r in out.records() {
            let shard = skein_shard(r.shard_id().expect("a shard id"));
            last.insert(shard, r.sequence_number().expect("a sequence").to_string());
        }
    }
    last
}

fn skein_shard(id: &str) -> i64 {
    id.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a shard number")
}

fn after_or_at(a: &str, b: &str) -> bool {
    (a.len(), a) >= (b.len(), b)
}

/// What the committed epoch's offsets-log entries say each shard was read
/// to (shard -> sequence number), read through the engine's checkpoint store.
fn committed_positions(checkpoints: &Path, epoch: u64) -> BTreeMap<i64, String> {
    let manifest: serde_json::Value =
        match std::fs::read_to_string(checkpoints.join("manifest.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
        {
            Some(m) => m,
            None => return BTreeMap::new(),
        };
    let (code, run) = (
        manifest["query_code"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        manifest["run"].as_str().unwrap_or_default().to_string(),
    );
    let members: std::collections::BTreeSet<(u32, u32)> =
        skein_engine::checkpoint::local_keys(checkpoints, "members")
            .unwrap_or_default()
            .iter()
            .filter_map(|key| {
                let name = key.split('/').nth(1)?;
                let (stage, member) = name.split_once('-')?;
                Some((stage.parse().ok()?, member.parse().ok()?))
            })
            .collect();
    let dir = checkpoints.to_path_buf();
    // The store's local backend runs on tokio; this test's own runtime is busy
    // in the caller, so the read gets a runtime of its own.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        runtime.block_on(async move {
            let cs = skein_engine::checkpoint::CheckpointStore::attach_dir(dir, &code, &run);
            let mut read = BTreeMap::new();
            for (stage, member) in members {
                let Ok(Some(entry)) = cs.offsets(stage, member, epoch).await else {
                    continue;
                };
                for table in &entry.tables {
                    for o in &table.to {
                        if let Some(p) = &o.position {
                            read.insert(i64::from(o.partition), p.clone());
                        }
                    }
                }
            }
            read
        })
    })
    .join()
    .expect("reading the checkpoint store")
}

/// Waits until the committed epoch's offsets read every shard up to `last`.
fn wait_committed(checkpoints: &Path, last: &BTreeMap<i64, String>, run: &mut Child) {
    let started = Instant::now();
    loop {
        if let Some(status) = run.try_wait().expect("waiting for skein") {
            let mut stderr = String::new();
            if let Some(mut e) = run.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
            }
            panic!("skein exited early with {status}: {stderr}");
        }
        if let Some(e) = common::kills::committed_epoch(checkpoints) {
            let read = committed_positions(checkpoints, e);
            if last
                .iter()
                .all(|(s, seq)| read.get(s).is_some_and(|r| after_or_at(r, seq)))
            {
                return;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the run did not commit {last:?} in 180 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run_command(sql: &Path, checkpoints: &Path, drained: bool) -> Command {
    let mut c = common::skein_command_on_aws();
    c.args(["run", sql.to_str().expect("utf-8 path")])
        .args(["--interval", "50ms", "--json", "--checkpoint-dir"])
        .arg(checkpoints)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if drained {
        c.arg("--until-drained");
    }
    c
}

/// Kills a run that is still going (it must be: the test waited for its
/// commits).
fn kill(mut run: Child) {
    let (landed, status) = common::kills::sigkill(&mut run);
    assert!(landed, "the run was still running when killed: {status}");
}

async fn wait_active(kinesis: &aws_sdk_kinesis::Client, stream: &str) {
    use aws_sdk_kinesis::types::StreamStatus;
    common::within(30, "waiting for the reshard to finish", async {
        loop {
            let s = kinesis
                .describe_stream_summary()
                .stream_name(stream)
                .send()
                .await
                .expect("DescribeStreamSummary");
            if s.stream_description_summary().map(|d| d.stream_status())
                == Some(&StreamStatus::Active)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_and_a_merge_mid_run_count_every_record_once() {
    common::require_aws();
    let stream = common::unique_name("reshard");
    common::create_stream(&stream, 1).await;
    let kinesis = aws_sdk_kinesis::Client::new(&common::aws_sdk_config().await);
    let (records, reference) = windowed::records(6000, 1, 120_000);
    let (before, rest) = records.split_at(2000);
    let (during, after) = rest.split_at(2000);

    let dir = std::env::temp_dir().join(common::unique_name("skein-reshard"));
    let (out, checkpoints) = (dir.join("out"), dir.join("checkpoints"));
    std::fs::create_dir_all(&out).unwrap();
    let source = format!(
        "CREATE EXTERNAL TABLE ev (k VARCHAR, v BIGINT, ts TIMESTAMP) STORED AS KINESIS \
           LOCATION '{stream}' OPTIONS ('format' 'json', 'event_time' 'ts', \
           'max.records.per.pull' '300');"
    );
    let sink = windowed::files_sink(&out);
    let sql = dir.join("q.sql");
    std::fs::write(&sql, windowed::query(&source, &sink)).unwrap();

    // Before: one shard, read and committed.
    let last = put(&kinesis, &stream, before).await;
    let mut run = run_command(&sql, &checkpoints, false).spawn().unwrap();
    wait_committed(&checkpoints, &last, &mut run);

    // Split: the children take the records put during; the run is killed
    // straight after, and the next one resumes across the split.
    kinesis
        .split_shard()
        .stream_name(&stream)
        .shard_to_split("shardId-000000000000")
        .new_starting_hash_key((u128::MAX / 2 + 1).to_string())
        .send()
        .await
        .expect("SplitShard");
    wait_active(&kinesis, &stream).await;
    let last = put(&kinesis, &stream, during).await;
    assert_eq!(last.len(), 2, "the records went to both children: {last:?}");
    std::thread::sleep(Duration::from_millis(300));
    kill(run);
    let mut run = run_command(&sql, &checkpoints, false).spawn().unwrap();
    wait_committed(&checkpoints, &last, &mut run);

    // Merge the children back: the records put after go to the new shard.
    kinesis
        .merge_shards()
        .stream_name(&stream)
        .shard_to_merge("shardId-000000000001")
        .adjacent_shard_to_merge("shardId-000000000002")
        .send()
        .await
        .expect("MergeShards");
    wait_active(&kinesis, &stream).await;
    let last = put(&kinesis, &stream, after).await;
    assert_eq!(last.keys().collect::<Vec<_>>(), [&3], "one merged shard");
    wait_committed(&checkpoints, &last, &mut run);
    kill(run);

    // A last run to the end emits the windows still open.
    let done = run_command(&sql, &checkpoints, true).output().unwrap();
    assert!(
        done.status.success(),
        "the last run failed: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    let report = String::from_utf8_lossy(&done.stdout).to_string();
    windowed::assert_exact(
        &read_rows(&out, true),
        &reference,
        &format!("reshard {report}"),
    );

    // `skein status`: every open shard read up to its newest record.
    let status = common::skein_command_on_aws()
        .args([
            "status",
            sql.to_str().unwrap(),
            "--json",
            "--checkpoint-dir",
        ])
        .arg(&checkpoints)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "skein status failed: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let status: QueryStatus = serde_json::from_slice(&status.stdout).unwrap();
    let behind: Vec<i64> = status
        .partitions
        .iter()
        .filter_map(|p| p.behind_ms)
        .collect();
    assert!(!behind.is_empty(), "no shard's delay measured: {status:?}");
    assert!(behind.iter().all(|ms| *ms == 0), "{status:?}");
    assert_eq!(status.behind_ms, Some(0), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
