//! A Kafka source keeps its member's offsets log between checkpoints in
//! Kafka itself (a committed offset's metadata, in a transaction), so an
//! epoch between checkpoints writes nothing to the checkpoint store.
//!
//! Checked on a real broker: the note reads back on a cold instance, the
//! committed offsets are where the member stands, an instance replaced by
//! a newer one can no longer write it, a note too long for the broker is
//! refused (the engine then writes the store), and a standing-style run
//! with a commit every 4 epochs leaves member objects only at its
//! checkpoint epochs while its result stays exact.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use skein_connectors::kafka::{KafkaSourceFactory, note_group};
use skein_engine::source::{EpochSpec, Source, SourceConfig, SourceFactory};

use crate::common::kafka::{PartitionWriter, create_topic, end_offsets};

fn source(brokers: &str, topic: &str) -> Arc<dyn Source> {
    source_with(brokers, topic, &[]).unwrap()
}

fn source_with(
    brokers: &str,
    topic: &str,
    options: &[(&str, &str)],
) -> skein_engine::error::Result<Arc<dyn Source>> {
    let config = SourceConfig {
        kind: "KAFKA".into(),
        location: topic.to_string(),
        options: [("bootstrap.servers", brokers), ("format", "json")]
            .iter()
            .chain(options)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)]));
    KafkaSourceFactory.create(&config, schema)
}

/// The offsets committed in `group` for the topic's partitions 0..n.
fn committed(brokers: &str, group: &str, topic: &str, n: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        tpl.add_partition(topic, p);
    }
    let got = consumer
        .committed_offsets(tpl, std::time::Duration::from_secs(30))
        .unwrap();
    (0..n)
        .map(|p| match got.find_partition(topic, p).unwrap().offset() {
            Offset::Offset(o) => o,
            other => panic!("partition {p} of group {group}: {other:?}"),
        })
        .collect()
}

#[test]
fn a_note_reads_back_cold_commits_the_position_and_fences_the_instance_it_replaced() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("offsets-note");
    create_topic(&brokers, &topic, 2);
    let writer = PartitionWriter::new(&brokers, &topic);
    for i in 0..300 {
        writer.send(i % 2, &format!(r#"{{"v":{i}}}"#));
    }
    writer.flush();
    let spec = EpochSpec {
        instance: 0,
        instances: 1,
        epoch: 1,
        epochs: None,
    };
    let key = common::unique_name("note");
    let rt = tokio::runtime::Runtime::new().unwrap();

    let first = source(&brokers, &topic);
    let pulled = rt.block_on(first.pull(spec)).unwrap();
    let rows: usize = pulled.batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 300);
    assert!(rt.block_on(first.keep_note(spec, &key, "epoch 1")).unwrap());
    assert_eq!(
        committed(&brokers, &note_group(&key), &topic, 2),
        end_offsets(&brokers, &topic),
        "the note's offsets are where the member stands"
    );
    // Kept again: the newest note is the one read.
    assert!(rt.block_on(first.keep_note(spec, &key, "epoch 2")).unwrap());

    // A cold instance (a restart, a recycled function) reads it, and from
    // then on the one it replaced cannot write.
    let second = source(&brokers, &topic);
    assert_eq!(
        rt.block_on(second.kept_note(spec, &key))
            .unwrap()
            .as_deref(),
        Some("epoch 2")
    );
    let stale = rt.block_on(first.keep_note(spec, &key, "epoch 3 from a zombie"));
    assert!(
        stale.is_err(),
        "a replaced instance kept its note: {stale:?}"
    );
    assert_eq!(
        rt.block_on(second.kept_note(spec, &key))
            .unwrap()
            .as_deref(),
        Some("epoch 2")
    );
    assert!(
        rt.block_on(second.keep_note(spec, &key, "epoch 3"))
            .unwrap()
    );
    assert_eq!(
        rt.block_on(source(&brokers, &topic).kept_note(spec, &key))
            .unwrap()
            .as_deref(),
        Some("epoch 3")
    );

    // Longer than the broker keeps by default: refused, not failed.
    let long = "x".repeat(5000);
    assert!(!rt.block_on(second.keep_note(spec, &key, &long)).unwrap());
    // A table told to keep its log in the store neither keeps nor reads one.
    let in_store = source_with(&brokers, &topic, &[("offsets.log", "store")]).unwrap();
    assert!(!rt.block_on(in_store.keep_note(spec, &key, "x")).unwrap());
    assert_eq!(rt.block_on(in_store.kept_note(spec, &key)).unwrap(), None);
    let bad = source_with(&brokers, &topic, &[("offsets.log", "s3")]).unwrap_err();
    assert!(bad.to_string().contains("offsets.log"), "{bad}");
    // Another key is another note.
    assert_eq!(
        rt.block_on(second.kept_note(spec, &common::unique_name("other")))
            .unwrap(),
        None
    );
}

/// The epochs of the objects under `members/` of a checkpoint directory.
fn member_epochs(checkpoints: &std::path::Path) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for key in skein_engine::checkpoint::local_keys(checkpoints, "members").unwrap() {
        let name = key.rsplit('/').next().unwrap_or_default();
        let digits: String = name.chars().take_while(|c| c.is_ascii_digit()).collect();
        out.insert(
            digits
                .parse()
                .unwrap_or_else(|_| panic!("an epoch object: {key}")),
        );
    }
    out
}

#[test]
fn between_checkpoints_a_kafka_query_writes_no_member_objects_and_stays_exact() {
    let (records, reference) = common::windowed::records(40_000, 2, 120_000);
    // Two source members, a partition each, each keeping its own note.
    let source = common::windowed::kafka_table(&records, 2, 2000).replacen(
        "'format' 'json',",
        "'format' 'json', 'parallelism' '2',",
        1,
    );
    assert!(source.contains("'parallelism' '2'"), "{source}");
    run_committing_every_4_epochs(&source, "ev", &reference);
}

/// Two Kafka tables read by the same source member: each keeps a note of
/// its own (one transactional id would fence the other).
#[test]
fn a_member_reading_two_kafka_tables_keeps_a_note_in_each_and_stays_exact() {
    use common::windowed;
    let (records, reference) = windowed::records(40_000, 2, 120_000);
    let (even, odd): (Vec<_>, Vec<_>) = records
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    let strip =
        |v: Vec<(usize, (usize, String))>| v.into_iter().map(|(_, r)| r).collect::<Vec<_>>();
    let first = windowed::kafka_table(&strip(even), 2, 1000);
    let second = windowed::kafka_table(&strip(odd), 2, 1000).replacen("TABLE ev ", "TABLE ev2 ", 1);
    let source = format!("{first}\n{second}");
    run_committing_every_4_epochs(
        &source,
        "(SELECT * FROM ev UNION ALL SELECT * FROM ev2) AS both_tables",
        &reference,
    );
}

/// Runs the windowed count over `from` (tables `source` declares) for 24
/// epochs committing every 4th, and checks the store and the result.
fn run_committing_every_4_epochs(
    source: &str,
    from: &str,
    reference: &common::windowed::Reference,
) {
    use common::windowed;
    let dir = std::env::temp_dir().join(common::unique_name("offsets-note"));
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let sink = windowed::files_sink(&out);
    let sql = dir.join("q.sql");
    let query = windowed::query(source, &sink)
        .replace("FROM ev GROUP BY", &format!("FROM {from} GROUP BY"));
    std::fs::write(&sql, query).unwrap();
    let checkpoints = dir.join("checkpoints");
    // 40,000 records at 2,000 a pull: the 20 epochs of the run read them all.
    let (ok, stdout, stderr) = common::skein(&[
        "run",
        sql.to_str().unwrap(),
        "--epochs",
        "24",
        "--checkpoint-interval",
        "4",
        "--checkpoint-dir",
        checkpoints.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "skein run failed: {stderr}");
    let epochs = member_epochs(&checkpoints);
    let at_checkpoints: BTreeSet<u64> = [0, 4, 8, 12, 16, 20, 23].into();
    assert!(
        epochs.is_subset(&at_checkpoints),
        "member objects of epochs between checkpoints: {:?}",
        epochs.difference(&at_checkpoints).collect::<Vec<_>>()
    );
    windowed::assert_exact(
        &common::rows::read_rows(&out, true),
        reference,
        &format!("files {stdout}"),
    );
    let _ = std::fs::remove_dir_all(&dir);
}
