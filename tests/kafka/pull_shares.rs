//! A Kafka source with a small pull budget over a backlog in several
//! partitions: every pull takes a share of every partition that has
//! records, rather than draining the partition whose records came first.
//!
//! librdkafka fetches a megabyte or more per partition at a time; on one
//! shared queue, a 300-record budget would read only the first partition's
//! fetch for many epochs, and event time (the slowest partition's) would
//! not move, so no window would close. Checked against the records the test
//! wrote: each pull stays within its budget, every partition moves within
//! the first pulls, and draining reads every record exactly once.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use skein::report::Report;
use skein_connectors::kafka::KafkaSourceFactory;
use skein_engine::source::{EpochSpec, SourceConfig, SourceFactory};

use crate::common::kafka::{PartitionWriter, create_topic};

const PARTITIONS: i32 = 3;
const PER_PARTITION: i64 = 20_000;
const BUDGET: usize = 300;

#[test]
fn a_small_pull_budget_moves_every_partition_of_a_backlog() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("pull-shares");
    create_topic(&brokers, &topic, PARTITIONS);
    let writer = PartitionWriter::new(&brokers, &topic);
    // v identifies the record: partition * PER_PARTITION + its index.
    for p in 0..PARTITIONS {
        for i in 0..PER_PARTITION {
            let v = p as i64 * PER_PARTITION + i;
            writer.send(p, &format!(r#"{{"k":"key-{}","v":{v}}}"#, i % 7));
        }
    }
    writer.flush();

    let config = SourceConfig {
        kind: "KAFKA".into(),
        location: topic.clone(),
        options: [
            ("bootstrap.servers", brokers.as_str()),
            ("format", "json"),
            ("max.records.per.pull", &BUDGET.to_string()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
    ]));
    let source = KafkaSourceFactory.create(&config, schema).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();

    let mut seen: BTreeMap<i64, u32> = BTreeMap::new();
    let mut moved_at: BTreeMap<String, u64> = BTreeMap::new();
    let total = PARTITIONS as i64 * PER_PARTITION;
    let mut epoch = 0u64;
    let mut read_at_half: Option<Vec<i64>> = None;
    while (seen.len() as i64) < total {
        epoch += 1;
        assert!(
            epoch <= 2 * total as u64 / BUDGET as u64 + 50,
            "{epoch} pulls read only {} of {total} records",
            seen.len()
        );
        let spec = EpochSpec {
            instance: 0,
            instances: 1,
            epoch,
            epochs: None,
        };
        let pulled = runtime.block_on(source.pull(spec)).unwrap();
        let mut records = 0;
        for batch in &pulled.batches {
            records += batch.num_rows();
            let v = batch
                .column(1)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            for i in 0..v.len() {
                *seen.entry(v.value(i)).or_default() += 1;
            }
        }
        assert!(
            records <= BUDGET,
            "pull {epoch} read {records} records, over its budget of {BUDGET}"
        );
        if read_at_half.is_none() && seen.len() as i64 >= total / 2 {
            let mut per = vec![0i64; PARTITIONS as usize];
            for v in seen.keys() {
                per[(v / PER_PARTITION) as usize] += 1;
            }
            read_at_half = Some(per);
        }
        for (progress, offset) in pulled.partitions.iter().zip(&pulled.offsets) {
            if offset.offset > 0 {
                moved_at.entry(progress.partition.clone()).or_insert(epoch);
            }
        }
    }
    // A fair share is BUDGET / PARTITIONS per pull; the first pull may see
    // only the partitions whose first fetch has arrived.
    assert_eq!(
        moved_at.len(),
        PARTITIONS as usize,
        "partitions that moved: {moved_at:?}"
    );
    for (partition, at) in &moved_at {
        assert!(
            *at <= 3,
            "partition {partition} first moved at pull {at}: a pull did not take a share of it \
             ({moved_at:?})"
        );
    }
    // Halfway through, every partition is about halfway through too.
    let per = read_at_half.unwrap();
    assert!(
        per.iter().all(|n| *n * 10 >= PER_PARTITION * 4),
        "records read per partition when half the backlog was read: {per:?} of {PER_PARTITION}"
    );
    let doubled: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(doubled.is_empty(), "records read twice: {doubled:?}");
    assert_eq!(seen.len() as i64, total);
    assert_eq!(seen.keys().next(), Some(&0));
    assert_eq!(seen.keys().last(), Some(&(total - 1)));
    assert!(
        epoch <= total as u64 / BUDGET as u64 + 10,
        "{epoch} pulls for {total} records at {BUDGET} a pull"
    );
}

/// `--verify` compares a run with single-process DataFusion over the rows
/// the run's sources read: with a pull budget smaller than the topic, the
/// reference is not one pull (2 of 5 rows), and with `--epochs` bounding
/// the run it is not the whole topic. A run that read nothing prices as
/// "no events", not as infinite dollars.
#[test]
fn verify_reads_what_the_run_read_whatever_the_pull_budget() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("verify-budget");
    create_topic(&brokers, &topic, 1);
    let writer = PartitionWriter::new(&brokers, &topic);
    for i in 0..5 {
        writer.send(0, &format!(r#"{{"k":"k{}","v":{i}}}"#, i % 3));
    }
    writer.flush();
    let dir = std::env::temp_dir().join(common::unique_name("verify-budget"));
    std::fs::create_dir_all(&dir).unwrap();
    let table = |topic: &str| {
        format!(
            "CREATE EXTERNAL TABLE t (k VARCHAR, v BIGINT) STORED AS KAFKA LOCATION '{topic}' \
             OPTIONS ('bootstrap.servers' '{brokers}', 'format' 'json', 'startup' 'earliest', \
             'max.records.per.pull' '2');\n"
        )
    };
    let file = dir.join("q.sql");
    std::fs::write(&file, format!("{}SELECT k, v FROM t;\n", table(&topic))).unwrap();
    let file = file.to_str().unwrap();
    for bound in [&["--until-drained"][..], &["--epochs", "2"][..]] {
        let mut args = vec!["run", file, "--no-checkpoint", "--verify", "--json"];
        args.extend(bound);
        let (ok, stdout, stderr) = common::skein(&args);
        assert!(ok, "skein {args:?}: {stderr}");
        let report = common::run_report(&stdout);
        let rows = if bound[0] == "--epochs" { 4 } else { 5 };
        assert_eq!(report.result_rows, rows, "{bound:?}: {report:?}");
        assert_eq!(report.verified, Some(true), "{bound:?}: {report:?}");
    }

    let empty = common::unique_name("verify-empty");
    create_topic(&brokers, &empty, 1);
    let file = dir.join("empty.sql");
    std::fs::write(
        &file,
        format!(
            "{}SELECT count(*) AS n, sum(v) AS s FROM t;\n",
            table(&empty)
        ),
    )
    .unwrap();
    let (ok, stdout, stderr) = common::skein(&[
        "run",
        file.to_str().unwrap(),
        "--no-checkpoint",
        "--until-drained",
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("| 0 |") && stdout.contains("no events, nothing to price"),
        "one row (0, NULL) and no price for no events:\n{stdout}"
    );
}

/// A table that does not say its `'parallelism'` reads with one instance
/// per partition, up to the cores the process may use: `skein explain`
/// says how many and why, and the table's own option still rules.
#[test]
fn a_kafka_table_reads_with_an_instance_per_partition_up_to_the_cores() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("sized");
    create_topic(&brokers, &topic, 3);
    let dir = std::env::temp_dir().join(common::unique_name("sized"));
    std::fs::create_dir_all(&dir).unwrap();
    let explain = |options: &str, pin: Option<&str>| -> serde_json::Value {
        let file = dir.join("q.sql");
        std::fs::write(
            &file,
            format!(
                "CREATE EXTERNAL TABLE t (k VARCHAR, v BIGINT) STORED AS KAFKA LOCATION '{topic}' \
                 OPTIONS ('bootstrap.servers' '{brokers}', 'format' 'json'{options});\n\
                 SELECT k, v FROM t;\n"
            ),
        )
        .unwrap();
        let file = file.to_str().unwrap();
        let mut cmd = match pin {
            Some(cores) => {
                let mut c = std::process::Command::new("taskset");
                c.args(["-c", cores, env!("CARGO_BIN_EXE_skein")]);
                c
            }
            None => std::process::Command::new(env!("CARGO_BIN_EXE_skein")),
        };
        let out = cmd.args(["explain", file, "--json"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "skein explain: {stderr}");
        let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        plan["tables"][0].clone()
    };
    let cores = std::thread::available_parallelism().unwrap().get();
    let table = explain("", None);
    assert_eq!(table["parallelism"], cores.min(3), "{table}");
    let why = table["parallelism_why"].as_str().unwrap();
    assert!(
        why.contains("3 partitions") && why.contains("core"),
        "{why}"
    );

    let table = explain("", Some("0"));
    assert_eq!(table["parallelism"], 1, "one core: {table}");
    assert!(
        table["parallelism_why"]
            .as_str()
            .unwrap()
            .contains("1 core"),
        "{table}"
    );

    let table = explain(", 'parallelism' '3'", Some("0"));
    assert_eq!(table["parallelism"], 3, "the option rules: {table}");
}

/// The offsets log is kept per source instance, so a query resumed from
/// its checkpoint reads with the instances it was checkpointed with, even
/// when the default would now be another (here: fewer cores). Every record
/// is read once over the two runs.
#[test]
fn a_resumed_query_keeps_the_instances_of_its_checkpoint() {
    let cores = std::thread::available_parallelism().unwrap().get();
    assert!(
        cores >= 2,
        "this test needs two cores to give the first run two source instances"
    );
    let brokers = common::require_kafka();
    let topic = common::unique_name("pinned");
    create_topic(&brokers, &topic, 4);
    let writer = PartitionWriter::new(&brokers, &topic);
    let write = |from: i64, n: i64| {
        for i in from..from + n {
            writer.send((i % 4) as i32, &format!(r#"{{"k":"k{}","v":{i}}}"#, i % 5));
        }
        writer.flush();
    };
    let dir = std::env::temp_dir().join(common::unique_name("pinned"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("q.sql");
    std::fs::write(
        &file,
        format!(
            "CREATE EXTERNAL TABLE t (k VARCHAR, v BIGINT) STORED AS KAFKA LOCATION '{topic}' \
             OPTIONS ('bootstrap.servers' '{brokers}', 'format' 'json');\n\
             SELECT k, v FROM t;\n"
        ),
    )
    .unwrap();
    let checkpoints = dir.join("checkpoints");
    let run = |cores: &str| -> Report {
        let out = std::process::Command::new("taskset")
            .args(["-c", cores, env!("CARGO_BIN_EXE_skein"), "run"])
            .arg(&file)
            .arg("--checkpoint-dir")
            .arg(&checkpoints)
            .args(["--until-drained", "--json"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "skein run: {stderr}");
        common::run_report(&String::from_utf8_lossy(&out.stdout))
    };
    write(0, 4_000);
    let first = run("0,1");
    assert_eq!(first.result_rows, 4_000, "{first:?}");
    write(4_000, 2_000);
    let second = run("0");
    assert_eq!(
        second.functions, first.functions,
        "the same source instances: {second:?}"
    );
    assert!(second.resumed_after.is_some(), "{second:?}");
    assert_eq!(
        second.result_rows, 2_000,
        "only the new records: {second:?}"
    );
}
